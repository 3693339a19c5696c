package dev.quiver.jvm.redis;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import org.junit.jupiter.api.Test;
import redis.clients.jedis.Jedis;

/** Flushes written on the writer thread: the same bytes as a write in the task thread, in order, every one in Redis
 * once the barrier returns, and a failure reported on the task thread with nothing written after it. */
class BackgroundWritesTest extends OnRedisServer {
    /** The vector's rows as one flush, then twice more (replays after a restart write the same values). */
    static List<FlushBuffer.Flush> flushes(Vectors.Vector v) {
        FlushBuffer buffer = new FlushBuffer(v.layout, v.encoder());
        List<FlushBuffer.Flush> out = new ArrayList<>();
        for (int i = 0; i < 3; i++) {
            v.rows.forEach(buffer::add);
            out.add(buffer.drain());
        }
        return out;
    }

    @Test
    void everyVectorLandsAfterTheBarrier() throws Exception {
        for (Vectors.Vector v : Vectors.load()) {
            List<FlushBuffer.Flush> written = new ArrayList<>();
            try (BackgroundWrites writes = new BackgroundWrites(
                    new RedisWriter(server.url(), 2000, v.layout, MARKERS), 1, v.layout.view, written::add)) {
                List<FlushBuffer.Flush> all = flushes(v);
                for (FlushBuffer.Flush f : all) {
                    writes.submit(f);
                    assertTrue(writes.pending() <= 1, "at most in-flight flushes out at once");
                }
                writes.awaitAll();
                assertEquals(0, writes.pending());
                assertEquals(all, written, "each flush reported once, in the order handed over");
            }
            assertStored(v);
        }
        try (Jedis j = server.client()) {
            assertEquals(Set.of("batch-user_spend-0001", "batch-merchant_traffic-0001",
                    "batch-user_last_transaction-0001"), j.smembers(MARKERS));
        }
    }

    @Test
    void aFailedWriteSurfacesOnTheTaskThreadAndStopsTheQueue() throws Exception {
        Vectors.Vector v = vector("user_spend");
        try (Jedis j = server.client()) {
            j.configSet("maxmemory", "1"); // every write refused: OOM
        }
        List<FlushBuffer.Flush> written = new ArrayList<>();
        try (BackgroundWrites writes = new BackgroundWrites(
                new RedisWriter(server.url(), 2000, v.layout, MARKERS), 4, v.layout.view, written::add)) {
            IOException e = assertThrows(IOException.class, () -> {
                for (FlushBuffer.Flush f : flushes(v)) {
                    writes.submit(f); // the refusal comes back later, on the task thread: here or at the barrier
                }
                writes.awaitAll();
            });
            assertTrue(e.getMessage().contains("refused") && e.getMessage().contains("OOM"), e.getMessage());
            assertEquals(0, writes.pending(), "what was queued behind a failure is dropped: the job replays it");
            assertEquals(List.of(), written);
        } finally {
            try (Jedis j = server.client()) {
                j.configSet("maxmemory", "0");
            }
        }
        try (Jedis j = server.client()) {
            assertEquals(Set.of(), j.smembers(MARKERS), "no marker without its rows");
        }
    }

    @Test
    void inFlightMustBePositive() {
        Vectors.Vector v;
        try {
            v = vector("user_spend");
        } catch (IOException e) {
            throw new AssertionError(e);
        }
        RedisWriter redis = new RedisWriter(server.url(), 2000, v.layout, MARKERS);
        assertThrows(IllegalArgumentException.class, () -> new BackgroundWrites(redis, 0, "v", f -> { }));
        redis.close();
    }
}
