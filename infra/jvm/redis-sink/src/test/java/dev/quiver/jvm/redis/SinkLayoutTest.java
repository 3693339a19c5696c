package dev.quiver.jvm.redis;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import org.apache.flink.table.types.logical.BigIntType;
import org.apache.flink.table.types.logical.DoubleType;
import org.apache.flink.table.types.logical.LogicalType;
import org.junit.jupiter.api.Test;

/** A layout or a table that does not fit is refused at planning time, with the reason. */
class SinkLayoutTest {
    @Test
    void aTableWithOtherColumnsIsRefused() throws Exception {
        Vectors.Vector v = RedisWriterTest.vector("user_spend");
        List<String> names = new ArrayList<>(v.names);
        List<LogicalType> types = new ArrayList<>(v.types);
        int sum = names.indexOf("amount__sum");
        types.set(sum, new BigIntType());
        names.remove(names.indexOf("__newest_us"));
        types.remove(types.size() - 1);
        names.add("extra");
        types.add(new DoubleType());
        String message = assertThrows(IllegalArgumentException.class, () -> new RowEncoder(v.layout, names, types))
                .getMessage();
        assertTrue(message.contains("column amount__sum is BIGINT, expected DOUBLE"), message);
        assertTrue(message.contains("missing column __newest_us"), message);
        assertTrue(message.contains("unexpected column extra"), message);
    }

    @Test
    void theMarkerColumnIsOptional() throws Exception {
        Vectors.Vector v = RedisWriterTest.vector("user_spend");
        List<String> names = new ArrayList<>(v.names);
        List<LogicalType> types = new ArrayList<>(v.types);
        types.remove(names.indexOf("__batch"));
        names.remove("__batch");
        new RowEncoder(v.layout, names, types);
    }

    @Test
    void aForeignLayoutIsRefused() throws Exception {
        String good = RedisWriterTest.vector("user_spend").json.get("layout").toString();
        assertThrows(IllegalArgumentException.class, () -> SinkLayout.parse("{}"));
        String message = assertThrows(IllegalArgumentException.class,
                () -> SinkLayout.parse(good.replace("\"version\":2", "\"version\":1"))).getMessage();
        assertTrue(message.contains("rebuild"), message);
        assertThrows(IllegalArgumentException.class, () -> SinkLayout.parse(good.replace("\"<f8\"", "\"<i8\"")));
        assertThrows(IllegalArgumentException.class, () -> SinkLayout.parse(good.replace("\"script\":\"tile\"",
                "\"script\":\"last\"")));
        assertEquals("tile", SinkLayout.parse(good).script);
    }

    @Test
    void keysEscapePercentAndColon() {
        assertEquals("a%3Ab%25c", RowEncoder.escape("a:b%c"));
        assertEquals("%7Ba%7D", RowEncoder.escape("{a}"));
        assertEquals("plain", RowEncoder.escape("plain"));
    }
}
