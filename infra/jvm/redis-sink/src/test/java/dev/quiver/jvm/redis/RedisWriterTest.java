package dev.quiver.jvm.redis;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.util.List;
import java.util.Set;
import org.apache.flink.table.data.GenericRowData;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.data.StringData;
import org.junit.jupiter.api.Test;
import redis.clients.jedis.Jedis;

/** The writer on a real redis-server: the vectors' bytes land as they are, replays change nothing, an older last
 * value never overwrites a newer one, NOSCRIPT is survived, freshness and markers are recorded. */
class RedisWriterTest extends OnRedisServer {
    static void write(Vectors.Vector v, List<RowData> rows) throws IOException {
        FlushBuffer buffer = new FlushBuffer(v.layout, v.encoder());
        rows.forEach(buffer::add);
        try (RedisWriter w = new RedisWriter(server.url(), 2000, v.layout, MARKERS)) {
            w.write(buffer.drain());
        }
    }

    @Test
    void everyVectorLandsAsThePythonStoreWritesIt() throws Exception {
        for (Vectors.Vector v : Vectors.load()) {
            write(v, v.rows);
            assertStored(v);
            write(v, v.rows); // a replay (a restart from the last checkpoint) changes nothing
            assertStored(v);
            try (Jedis j = server.client()) {
                assertEquals(v.json.get("max_event_ts").getAsString(), j.hget(v.layout.metaKey, "max_event_ts"));
            }
        }
        try (Jedis j = server.client()) {
            assertEquals(Set.of("batch-user_spend-0001", "batch-merchant_traffic-0001",
                    "batch-user_last_transaction-0001"), j.smembers(MARKERS));
        }
    }

    @Test
    void theSameBytesLandThroughAUnixSocket() throws Exception {
        for (Vectors.Vector v : Vectors.load()) {
            FlushBuffer buffer = new FlushBuffer(v.layout, v.encoder());
            v.rows.forEach(buffer::add);
            try (RedisWriter w = new RedisWriter(server.unixUrl(), 2000, v.layout, MARKERS)) {
                w.write(buffer.drain());
            }
            assertStored(v);
        }
        try (Jedis j = server.client()) {
            assertEquals(3, j.smembers(MARKERS).size());
        }
    }

    @Test
    void aUnixSocketThatIsNotThereFailsTheWriteWithItsPath() throws Exception {
        Vectors.Vector v = vector("user_spend");
        FlushBuffer buffer = new FlushBuffer(v.layout, v.encoder());
        v.rows.forEach(buffer::add);
        try (RedisWriter w = new RedisWriter("unix:///nonexistent/redis.sock", 500, v.layout, MARKERS)) {
            IOException e = assertThrows(IOException.class, () -> w.write(buffer.drain()));
            assertTrue(e.getMessage().contains("/nonexistent/redis.sock"), e.getMessage());
        }
    }

    @Test
    void anOlderLastValueNeverOverwritesANewerOne() throws Exception {
        Vectors.Vector v = vector("user_last_transaction");
        write(v, v.rows);
        GenericRowData older = row(v, 7L, 1_793_491_200_000_000L, 99.0, 5L, "travel");
        write(v, List.of(older));
        assertStored(v);
        GenericRowData newer = row(v, 7L, 1_793_491_300_000_000L, 1.0, 6L, "fuel");
        write(v, List.of(newer));
        try (Jedis j = server.client()) {
            byte[] stored = j.get(v.encoder().key(newer));
            assertArrayEquals(v.encoder().record(newer), stored);
            assertEquals("1793491300000000", j.hget(v.layout.metaKey, "max_event_ts"));
        }
        write(v, List.of(older)); // freshness never goes back either
        try (Jedis j = server.client()) {
            assertEquals("1793491300000000", j.hget(v.layout.metaKey, "max_event_ts"));
        }
    }

    @Test
    void aFlushedScriptCacheIsReloaded() throws Exception {
        Vectors.Vector v = vector("string_tiles");
        write(v, v.rows);
        try (Jedis j = server.client()) {
            j.scriptFlush();
            j.flushAll();
        }
        write(v, v.rows); // EVALSHA answers NOSCRIPT: sent again as EVAL
        assertStored(v);
    }

    @Test
    void aRefusedWriteFailsTheFlush() throws Exception {
        Vectors.Vector v = vector("user_spend");
        try (Jedis j = server.client()) {
            j.configSet("maxmemory", "1"); // every write refused: OOM
        }
        try {
            IOException e = assertThrows(IOException.class, () -> write(v, v.rows));
            assertTrue(e.getMessage().contains("refused") && e.getMessage().contains("OOM"), e.getMessage());
        } finally {
            try (Jedis j = server.client()) {
                j.configSet("maxmemory", "0");
            }
        }
    }

    @Test
    void noMarkerIsRecordedUnlessTheFlushIsComplete() throws Exception {
        Vectors.Vector v = vector("user_spend");
        try (Jedis j = server.client()) {
            j.set(v.layout.metaKey, "not a hash"); // the freshness script fails: WRONGTYPE
        }
        IOException e = assertThrows(IOException.class, () -> write(v, v.rows));
        assertTrue(e.getMessage().contains("WRONGTYPE"), e.getMessage());
        try (Jedis j = server.client()) {
            assertEquals(Set.of(), j.smembers(MARKERS), "a marker promises the whole flush is written");
        }
        try (Jedis j = server.client()) {
            j.del(v.layout.metaKey);
        }
        write(v, v.rows); // the replay after the restart completes it
        assertStored(v);
        try (Jedis j = server.client()) {
            assertEquals(Set.of("batch-user_spend-0001"), j.smembers(MARKERS));
        }
    }

    private static GenericRowData row(Vectors.Vector v, long user, long ts, double amount, long merchant,
                                      String category) {
        GenericRowData row = new GenericRowData(v.names.size());
        row.setField(v.names.indexOf("user_id"), user);
        row.setField(v.names.indexOf("event_ts"), ts);
        row.setField(v.names.indexOf("last_amount"), amount);
        row.setField(v.names.indexOf("last_merchant_id"), merchant);
        row.setField(v.names.indexOf("last_category"), StringData.fromString(category));
        return row;
    }
}
