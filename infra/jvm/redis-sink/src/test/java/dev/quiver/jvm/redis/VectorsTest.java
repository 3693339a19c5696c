package dev.quiver.jvm.redis;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import java.nio.charset.StandardCharsets;
import java.util.HexFormat;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

/** The Java encoder gives the Python codec's bytes: same keys, same records, same freshness, same markers. */
class VectorsTest {
    static TreeMap<String, String> expectedWrites(Vectors.Vector v) {
        TreeMap<String, String> out = new TreeMap<>();
        for (JsonElement w : v.json.getAsJsonArray("writes")) {
            JsonObject o = w.getAsJsonObject();
            out.put(o.get("key").getAsString(), o.get("value").getAsString());
        }
        return out;
    }

    static TreeMap<String, String> writes(FlushBuffer.Flush flush) {
        TreeMap<String, String> out = new TreeMap<>();
        for (int i = 0; i < flush.keys.size(); i++) {
            out.put(new String(flush.keys.get(i), StandardCharsets.UTF_8), HexFormat.of().formatHex(flush.values.get(i)));
        }
        return out;
    }

    static FlushBuffer.Flush flush(Vectors.Vector v) {
        FlushBuffer buffer = new FlushBuffer(v.layout, v.encoder());
        v.rows.forEach(buffer::add);
        return buffer.drain();
    }

    @TestFactory
    Stream<DynamicTest> everyVectorEncodesToThePythonBytes() throws Exception {
        return Vectors.load().stream().map(v -> DynamicTest.dynamicTest(v.name, () -> {
            FlushBuffer.Flush flush = flush(v);
            assertEquals(expectedWrites(v), writes(flush), v.name + ": keys and records");
            JsonElement ts = v.json.get("max_event_ts");
            assertEquals(ts.isJsonNull() ? null : ts.getAsLong(), flush.maxEventTs, v.name + ": max_event_ts");
            Set<String> markers = new TreeSet<>();
            v.json.getAsJsonArray("markers").forEach(m -> markers.add(m.getAsString()));
            assertEquals(markers, new TreeSet<>(flush.markers), v.name + ": markers");
            assertEquals(v.json.get("dropped").getAsLong(), flush.dropped, v.name + ": dropped rows");
        }));
    }

    @Test
    void theVectorsCoverTheEdges() throws Exception {
        var vectors = Vectors.load();
        Set<String> kinds = vectors.stream().map(v -> v.layout.kind).collect(Collectors.toSet());
        assertEquals(Set.of("tiles", "last"), kinds);
        assertTrue(vectors.stream().anyMatch(v -> v.layout.varLenOffset > 0), "a tile record with strings");
        assertTrue(vectors.stream().anyMatch(v -> v.layout.nullBitmapBytes > 1), "a two-byte null bitmap");
        assertTrue(vectors.stream().anyMatch(v -> v.layout.keys.size() > 1), "a composite key");
        String rows = vectors.stream().map(v -> v.json.getAsJsonArray("rows").toString()).collect(Collectors.joining());
        for (String edge : new String[] {"\"NaN\"", "Infinity", "𝄞", "\"\"", "null", ":"}) {
            assertTrue(rows.contains(edge), "no vector holds " + edge);
        }
        assertTrue(rows.contains("-31536001234567"), "an event before 1970");
    }

    @Test
    void aDrainedBufferIsEmpty() throws Exception {
        Vectors.Vector v = Vectors.load().get(0);
        FlushBuffer buffer = new FlushBuffer(v.layout, v.encoder());
        v.rows.forEach(buffer::add);
        assertFalse(buffer.drain().isEmpty());
        assertEquals(0, buffer.rows());
        assertTrue(buffer.drain().isEmpty());
    }
}
