package dev.quiver.jvm.redis;

import java.io.ByteArrayOutputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.data.StringData;
import org.apache.flink.table.types.logical.LogicalType;
import org.apache.flink.table.types.logical.LogicalTypeRoot;

/**
 * One sink row → its Redis key and packed record, as layout.py / codec.py define them (little-endian, no padding;
 * a null is stored as 0, flagged in the null bitmap for last values; string bytes follow the fixed part).
 *
 * <p>Everything is copied out of the row at once: with {@code pipeline.object-reuse} the row is not ours after
 * {@code write} returns.
 */
final class RowEncoder {
    /** What the buffer keeps of a feature row (its key is its entity's, kept once per entity). */
    static final class Encoded {
        final byte[] record;
        final long time; // tile_start or event_ts
        final long events; // n_events (tiles)
        final Object[] order; // last values: field values for the tie rule (Long, Double, Boolean, byte[], null)

        Encoded(byte[] record, long time, long events, Object[] order) {
            this.record = record;
            this.time = time;
            this.events = events;
            this.order = order;
        }
    }

    private final SinkLayout layout;
    private final byte[] prefix;
    private final int[] keyIndex;
    private final int[] fieldIndex;
    private final int timeIndex;
    private final int eventsIndex;
    private final int newestIndex;
    private final int markerIndex;
    private final int orderFields;

    /** Binds the layout to the sink table's columns; refuses a table whose columns do not match it. */
    RowEncoder(SinkLayout layout, List<String> names, List<LogicalType> types) {
        this.layout = layout;
        this.prefix = layout.keyPrefix.getBytes(StandardCharsets.UTF_8);
        Map<String, LogicalTypeRoot> expected = expectedColumns(layout);
        Map<String, Integer> index = new HashMap<>();
        List<String> problems = new ArrayList<>();
        for (int i = 0; i < names.size(); i++) {
            String name = names.get(i);
            index.put(name, i);
            LogicalTypeRoot want = expected.get(name);
            LogicalTypeRoot got = types.get(i).getTypeRoot();
            if (want == null) {
                problems.add("unexpected column " + name);
            } else if (!(got == want || (want == LogicalTypeRoot.VARCHAR && got == LogicalTypeRoot.CHAR))) {
                problems.add("column " + name + " is " + types.get(i) + ", expected " + want);
            }
        }
        for (String name : expected.keySet()) {
            if (!index.containsKey(name) && !name.equals(layout.markerColumn)) {
                problems.add("missing column " + name);
            }
        }
        if (!problems.isEmpty()) {
            throw new IllegalArgumentException("sink table of view " + layout.view + " does not match its layout: "
                    + String.join("; ", problems));
        }
        keyIndex = layout.keys.stream().mapToInt(k -> index.get(k.column)).toArray();
        fieldIndex = layout.fields.stream().mapToInt(f -> index.get(f.column)).toArray();
        timeIndex = index.get(layout.timeColumn);
        eventsIndex = layout.eventsColumn == null ? -1 : index.get(layout.eventsColumn);
        newestIndex = layout.newestColumn == null ? -1 : index.get(layout.newestColumn);
        markerIndex = layout.markerColumn == null ? -1 : index.getOrDefault(layout.markerColumn, -1);
        orderFields = (int) layout.fields.stream().filter(f -> f.nullBit >= 0).count();
    }

    /** The sink table's columns as the layout sees them, in compile/flink.py's order, with their types. */
    static Map<String, LogicalTypeRoot> expectedColumns(SinkLayout layout) {
        Map<String, LogicalTypeRoot> out = new LinkedHashMap<>();
        for (SinkLayout.Key k : layout.keys) {
            out.put(k.column, rootOf(k.dtype));
        }
        if (layout.markerColumn != null) {
            out.put(layout.markerColumn, LogicalTypeRoot.VARCHAR);
        }
        for (SinkLayout.Field f : layout.fields) {
            out.put(f.column, rootOf(f.dtype));
        }
        if (layout.newestColumn != null) {
            out.put(layout.newestColumn, LogicalTypeRoot.BIGINT);
        }
        return out;
    }

    /** The Flink SQL type of a logical dtype (compile/flink.py's TYPES: timestamps are BIGINT epoch µs). */
    static LogicalTypeRoot rootOf(String dtype) {
        switch (dtype) {
            case "int64":
            case "timestamp":
                return LogicalTypeRoot.BIGINT;
            case "float64":
                return LogicalTypeRoot.DOUBLE;
            case "bool":
                return LogicalTypeRoot.BOOLEAN;
            case "string":
                return LogicalTypeRoot.VARCHAR;
            default:
                throw new IllegalArgumentException("unknown dtype " + dtype);
        }
    }

    /** The batch marker of a marker row, else null. */
    String marker(RowData row) {
        return markerIndex < 0 || row.isNullAt(markerIndex) ? null : row.getString(markerIndex).toString();
    }

    /** Whether the row is a feature row: every join key and its time are set (the loader drops the others). */
    boolean complete(RowData row) {
        for (int i : keyIndex) {
            if (row.isNullAt(i)) {
                return false;
            }
        }
        return !row.isNullAt(timeIndex);
    }

    /** Record, time and tie-rule values of a complete row. */
    Encoded encode(RowData row) {
        return new Encoded(record(row), time(row), events(row), layout.isTiles() ? null : order(row));
    }

    /** The row's tile_start (tiles) or event time (last values). */
    long time(RowData row) {
        return row.getLong(timeIndex);
    }

    /** The tile's event count (0 for last values). */
    long events(RowData row) {
        return eventsIndex < 0 || row.isNullAt(eventsIndex) ? 0 : row.getLong(eventsIndex);
    }

    /**
     * Which entity the row is for, as a small value that is cheap to hash and compare (a Long for one int64 key):
     * the buffer groups rows by it and builds the Redis key only once per entity and flush.
     */
    Object entity(RowData row) {
        if (keyIndex.length == 1) {
            return keyPart(row, 0);
        }
        Object[] parts = new Object[keyIndex.length];
        for (int k = 0; k < keyIndex.length; k++) {
            parts[k] = keyPart(row, k);
        }
        return Arrays.asList(parts);
    }

    private Object keyPart(RowData row, int k) {
        int i = keyIndex[k];
        switch (layout.keys.get(k).dtype) {
            case "int64":
                return row.getLong(i);
            case "bool":
                return row.getBoolean(i);
            default:
                return row.getString(i).toString();
        }
    }

    /** The freshness time of the row: a tile's newest event, else its time. */
    long newest(RowData row) {
        long time = row.getLong(timeIndex);
        // The loader raises freshness to a tile's newest event; the store's own write to its tile_start.
        return newestIndex < 0 || row.isNullAt(newestIndex) ? time : Math.max(time, row.getLong(newestIndex));
    }

    byte[] key(RowData row) {
        ByteArrayOutputStream out = new ByteArrayOutputStream(prefix.length + 24);
        out.write(prefix, 0, prefix.length);
        for (int k = 0; k < keyIndex.length; k++) {
            if (k > 0) {
                out.write(':');
            }
            int i = keyIndex[k];
            String dtype = layout.keys.get(k).dtype;
            byte[] part;
            if ("int64".equals(dtype)) {
                part = Long.toString(row.getLong(i)).getBytes(StandardCharsets.US_ASCII);
            } else if ("bool".equals(dtype)) {
                part = new byte[] {(byte) (row.getBoolean(i) ? '1' : '0')};
            } else {
                part = escape(row.getString(i).toString()).getBytes(StandardCharsets.UTF_8);
            }
            out.write(part, 0, part.length);
        }
        out.write('}'); // closes the hash tag the prefix opens: a cluster places the key by its entity
        return out.toByteArray();
    }

    /** `%`, `:`, `{` and `}` percent-escaped, so composite keys never collide and the braces stay the key's
     * hash tag (layout._escape). */
    static String escape(String value) {
        if (value.indexOf('%') < 0 && value.indexOf(':') < 0 && value.indexOf('{') < 0 && value.indexOf('}') < 0) {
            return value;
        }
        return value.replace("%", "%25").replace(":", "%3A").replace("{", "%7B").replace("}", "%7D");
    }

    byte[] record(RowData row) {
        ByteBuffer fixed = ByteBuffer.allocate(layout.width).order(ByteOrder.LITTLE_ENDIAN);
        List<byte[]> strings = new ArrayList<>(0);
        int varLen = 0;
        for (int j = 0; j < fieldIndex.length; j++) {
            SinkLayout.Field f = layout.fields.get(j);
            int i = fieldIndex[j];
            if (row.isNullAt(i)) {
                if (f.nullBit >= 0) {
                    int at = layout.nullBitmapOffset + f.nullBit / 8;
                    fixed.put(at, (byte) (fixed.get(at) | (1 << (f.nullBit % 8))));
                }
                if ("string".equals(f.dtype)) {
                    strings.add(new byte[0]);
                }
                continue; // the slot stays 0
            }
            switch (f.dtype) {
                case "int64":
                case "timestamp":
                    fixed.putLong(f.offset, row.getLong(i));
                    break;
                case "float64":
                    // Canonical NaN bits, as numpy writes Python's float('nan').
                    fixed.putLong(f.offset, Double.doubleToLongBits(row.getDouble(i)));
                    break;
                case "bool":
                    fixed.put(f.offset, (byte) (row.getBoolean(i) ? 1 : 0));
                    break;
                default: // string: its UTF-8 length here, the bytes after the fixed part
                    byte[] bytes = utf8(row.getString(i));
                    fixed.putInt(f.offset, bytes.length);
                    strings.add(bytes);
                    varLen += bytes.length;
            }
        }
        if (layout.varLenOffset > 0) {
            fixed.putInt(layout.varLenOffset, varLen);
        }
        if (varLen == 0) {
            return fixed.array();
        }
        byte[] out = Arrays.copyOf(fixed.array(), layout.width + varLen);
        int pos = layout.width;
        for (byte[] s : strings) {
            System.arraycopy(s, 0, out, pos, s.length);
            pos += s.length;
        }
        return out;
    }

    private Object[] order(RowData row) {
        Object[] values = new Object[orderFields];
        int n = 0;
        for (int j = 0; j < fieldIndex.length; j++) {
            SinkLayout.Field f = layout.fields.get(j);
            if (f.nullBit < 0) {
                continue;
            }
            int i = fieldIndex[j];
            Object v = null;
            if (!row.isNullAt(i)) {
                switch (f.dtype) {
                    case "float64":
                        v = row.getDouble(i);
                        break;
                    case "bool":
                        v = row.getBoolean(i);
                        break;
                    case "string":
                        v = utf8(row.getString(i));
                        break;
                    default:
                        v = row.getLong(i);
                }
            }
            values[n++] = v;
        }
        return values;
    }

    private static byte[] utf8(StringData s) {
        byte[] b = s.toBytes();
        return Arrays.copyOf(b, b.length); // toBytes may hand out the row's own buffer
    }

    /**
     * The offline tie rule for two last values of one entity at one event time (codec.newest_per_entity): field
     * by field, NULL lowest, NaN greatest, -0.0 equal to 0.0, strings by UTF-8 bytes. Positive: a wins.
     */
    static int compareOrder(Object[] a, Object[] b) {
        for (int i = 0; i < a.length; i++) {
            int c = compareValue(a[i], b[i]);
            if (c != 0) {
                return c;
            }
        }
        return 0;
    }

    private static int compareValue(Object a, Object b) {
        if (a == null || b == null) {
            return a == null ? (b == null ? 0 : -1) : 1;
        }
        if (a instanceof Double) {
            double x = (Double) a;
            double y = (Double) b;
            if (Double.isNaN(x) || Double.isNaN(y)) {
                return Boolean.compare(Double.isNaN(x), Double.isNaN(y));
            }
            return x < y ? -1 : (x > y ? 1 : 0);
        }
        if (a instanceof byte[]) {
            return Arrays.compareUnsigned((byte[]) a, (byte[]) b);
        }
        if (a instanceof Boolean) {
            return Boolean.compare((Boolean) a, (Boolean) b);
        }
        return Long.compare((Long) a, (Long) b);
    }
}
