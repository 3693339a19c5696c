package dev.quiver.jvm.redis;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.HexFormat;
import java.util.Map;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import redis.clients.jedis.Jedis;

/** What the writer tests share: a private redis-server per test class, emptied before each test, and the check
 * that a vector's keys hold the bytes the Python store writes. */
abstract class OnRedisServer {
    static RedisServer server;
    static final String MARKERS = "q:fraud:_markers:transactions";

    @BeforeAll
    static void start() throws Exception {
        server = new RedisServer();
    }

    @AfterAll
    static void stop() {
        server.close();
    }

    @BeforeEach
    void empty() {
        try (Jedis j = server.client()) {
            j.flushAll();
        }
    }

    static Vectors.Vector vector(String name) throws IOException {
        return Vectors.load().stream().filter(v -> v.name.equals(name)).findFirst().orElseThrow();
    }

    static void assertStored(Vectors.Vector v) {
        try (Jedis j = server.client()) {
            for (Map.Entry<String, String> e : VectorsTest.expectedWrites(v).entrySet()) {
                byte[] got = j.get(e.getKey().getBytes(StandardCharsets.UTF_8));
                assertEquals(e.getValue(), got == null ? null : HexFormat.of().formatHex(got), e.getKey());
            }
        }
    }
}
