package dev.quiver.jvm.redis;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.flink.table.data.GenericRowData;
import org.apache.flink.table.data.RowData;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.Jedis;

/** The writer on a real Redis Cluster (six redis-server processes, 3 masters and 3 replicas, made with
 * {@code redis-cli --cluster create}): every vector's bytes land under the same keys as on one server, each on the
 * master of its slot, and a flush sent while a master is being replaced (SIGKILL, its replica promoted) is
 * retried until it lands. */
class ClusterWriterTest {
    static final List<Process> nodes = new ArrayList<>();
    static final Map<Integer, Process> byPort = new LinkedHashMap<>();
    static String url;

    @BeforeAll
    static void start() throws Exception {
        String binary = System.getenv().getOrDefault("REDIS_SERVER", "redis-server");
        Path dir = Files.createTempDirectory("quiver-redis-cluster");
        List<String> addresses = new ArrayList<>();
        for (int i = 0; i < 6; i++) {
            int port = freePort();
            Path folder = Files.createDirectories(dir.resolve(Integer.toString(port)));
            ProcessBuilder builder = new ProcessBuilder(binary, "--port", Integer.toString(port), "--bind",
                    "127.0.0.1", "--dir", folder.toString(), "--save", "", "--appendonly", "no",
                    "--cluster-enabled", "yes", "--cluster-port", Integer.toString(freePort()),
                    "--cluster-node-timeout", "1000", "--cluster-require-full-coverage", "no",
                    "--repl-diskless-sync-delay", "0");
            builder.redirectErrorStream(true).redirectOutput(folder.resolve("redis.log").toFile());
            Process p = builder.start();
            nodes.add(p);
            byPort.put(port, p);
            addresses.add("127.0.0.1:" + port);
            waitForPing(port);
        }
        List<String> create = new ArrayList<>(List.of("redis-cli", "--cluster", "create"));
        create.addAll(addresses);
        create.addAll(List.of("--cluster-replicas", "1", "--cluster-yes"));
        Process made = new ProcessBuilder(create).redirectErrorStream(true).start();
        String out = new String(made.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        assertEquals(0, made.waitFor(), out);
        url = "redis+cluster://" + addresses.get(0) + "," + addresses.get(1);
        waitUntilSettled();
    }

    @AfterAll
    static void stop() {
        nodes.forEach(Process::destroyForcibly);
    }

    @Test
    void everyVectorLandsOnTheMasterOfItsSlot() throws Exception {
        int masters = 0;
        try (ClusterRoute route = new ClusterRoute(url, 2000)) {
            for (Vectors.Vector v : Vectors.load()) {
                write(v, v.rows);
                assertStored(route, v);
                write(v, v.rows); // a replay changes nothing
                assertStored(route, v);
                byte[] meta = v.layout.metaKey.getBytes(StandardCharsets.UTF_8);
                assertEquals(v.json.get("max_event_ts").getAsString(),
                        route.connection(route.ownerOf(meta)).hget(v.layout.metaKey, "max_event_ts"));
            }
            masters = (int) byPort.keySet().stream().filter(p -> isMaster(p)).count();
        }
        assertEquals(3, masters);
    }

    @Test
    void aFlushDuringAFailoverIsRetriedUntilItLands() throws Exception {
        Vectors.Vector v = OnRedisServer.vector("user_last_transaction");
        write(v, v.rows);
        RowData newer = v.rows.get(0);
        GenericRowData later = new GenericRowData(v.names.size());
        for (int i = 0; i < v.names.size(); i++) {
            later.setField(i, ((GenericRowData) newer).getField(i));
        }
        later.setField(v.names.indexOf("event_ts"), 1_893_456_000_000_000L); // years later: it must win
        byte[] key = v.encoder().key(later);
        int victim;
        try (ClusterRoute route = new ClusterRoute(url, 2000)) {
            victim = route.ownerOf(key).getPort();
        }
        byPort.get(victim).destroyForcibly().waitFor(); // the master of the key dies: its replica takes over
        long began = System.currentTimeMillis();
        write(v, List.of(later));
        long took = System.currentTimeMillis() - began;
        try (ClusterRoute route = new ClusterRoute(url, 2000)) {
            HostAndPort now = route.ownerOf(key);
            assertTrue(now.getPort() != victim, "the slot moved to the promoted replica");
            assertArrayEquals(v.encoder().record(later), route.connection(now).get(key));
        }
        System.out.println("ClusterWriterTest: the flush landed " + took + " ms after the master's SIGKILL");
    }

    static void write(Vectors.Vector v, List<RowData> rows) throws IOException {
        FlushBuffer buffer = new FlushBuffer(v.layout, v.encoder());
        rows.forEach(buffer::add);
        try (RedisWriter w = new RedisWriter(url, 2000, v.layout, OnRedisServer.MARKERS)) {
            w.write(buffer.drain());
        }
    }

    static void assertStored(ClusterRoute route, Vectors.Vector v) {
        for (Map.Entry<String, String> e : VectorsTest.expectedWrites(v).entrySet()) {
            byte[] key = e.getKey().getBytes(StandardCharsets.UTF_8);
            byte[] got = route.connection(route.ownerOf(key)).get(key);
            assertEquals(e.getValue(), got == null ? null : HexFormat.of().formatHex(got), e.getKey());
        }
    }

    static boolean isMaster(int port) {
        if (!byPort.get(port).isAlive()) {
            return false;
        }
        try (Jedis j = new Jedis("127.0.0.1", port)) {
            return j.info("replication").contains("role:master");
        }
    }

    static int freePort() throws IOException {
        try (ServerSocket socket = new ServerSocket(0)) {
            return socket.getLocalPort();
        }
    }

    static void waitForPing(int port) throws Exception {
        for (int i = 0; i < 400; i++) {
            try (Jedis j = new Jedis("127.0.0.1", port)) {
                j.ping();
                return;
            } catch (RuntimeException e) {
                Thread.sleep(25);
            }
        }
        throw new IOException("redis-server did not answer on port " + port);
    }

    /** Until every node says cluster_state:ok and every replica has its master's data. */
    static void waitUntilSettled() throws Exception {
        for (int i = 0; i < 600; i++) {
            boolean settled = true;
            for (int port : byPort.keySet()) {
                try (Jedis j = new Jedis("127.0.0.1", port)) {
                    String replication = j.info("replication");
                    settled &= j.clusterInfo().contains("cluster_state:ok")
                            && (replication.contains("role:master") || replication.contains("master_link_status:up"));
                }
            }
            if (settled) {
                return;
            }
            Thread.sleep(100);
        }
        throw new IOException("the Redis Cluster did not settle within 60 s");
    }
}
