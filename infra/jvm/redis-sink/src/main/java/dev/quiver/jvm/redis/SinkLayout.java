package dev.quiver.jvm.redis;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

/**
 * How one view's sink rows become Redis keys and records: the JSON of {@code quiver.online.jvm_sink.sink_layout}.
 *
 * <p>The Java side derives nothing from the catalog; every offset and width comes from Python's layout.py, so the
 * two writers cannot disagree on a byte (tests/vectors/online_records.json checks both).
 */
public final class SinkLayout implements Serializable {
    private static final long serialVersionUID = 1L;
    /** The JSON shape this reader understands (jvm_sink.LAYOUT_VERSION). */
    public static final int VERSION = 2; // 2: keys end with the entity as a hash tag, {<entity>}

    /** One fixed slot of the record: which sink column fills it, how, and where. */
    public static final class Field implements Serializable {
        private static final long serialVersionUID = 1L;
        public final String column;
        public final String dtype; // int64 | float64 | bool | timestamp | string
        public final String slot; // <i8 | <f8 | u1 | <u4
        public final int offset;
        public final int nullBit; // -1: a null is stored as 0 with no flag (tiles)

        Field(String column, String dtype, String slot, int offset, int nullBit) {
            this.column = column;
            this.dtype = dtype;
            this.slot = slot;
            this.offset = offset;
            this.nullBit = nullBit;
        }
    }

    /** One join key column. */
    public static final class Key implements Serializable {
        private static final long serialVersionUID = 1L;
        public final String column;
        public final String dtype; // int64 | string | bool

        Key(String column, String dtype) {
            this.column = column;
            this.dtype = dtype;
        }
    }

    public final String view;
    public final String kind; // tiles | last
    public final String script; // tile | last: the Lua file
    public final String keyPrefix;
    public final String metaKey;
    public final List<Key> keys;
    public final String markerColumn;
    public final String timeColumn;
    public final String newestColumn; // null for last values (their time column is their freshness)
    public final String eventsColumn; // null for last values
    public final long trimHorizonUs;
    public final int width;
    public final int varLenOffset; // 0: no strings in a tile record
    public final int nullBitmapOffset; // -1: none
    public final int nullBitmapBytes;
    public final List<Field> fields;

    private SinkLayout(JsonObject o) {
        int version = o.get("version").getAsInt();
        if (version != VERSION) {
            throw new IllegalArgumentException(
                    "layout version " + version + " is not " + VERSION + ": rebuild the redis-sink jar");
        }
        view = o.get("view").getAsString();
        kind = o.get("kind").getAsString();
        script = o.get("script").getAsString();
        keyPrefix = o.get("key_prefix").getAsString();
        metaKey = o.get("meta_key").getAsString();
        markerColumn = text(o.get("marker_column"));
        timeColumn = o.get("time_column").getAsString();
        newestColumn = text(o.get("newest_column"));
        eventsColumn = text(o.get("events_column"));
        trimHorizonUs = o.get("trim_horizon_us").getAsLong();
        width = o.get("width").getAsInt();
        varLenOffset = o.get("var_len_offset").getAsInt();
        JsonElement nulls = o.get("null_bitmap");
        if (nulls == null || nulls.isJsonNull()) {
            nullBitmapOffset = -1;
            nullBitmapBytes = 0;
        } else {
            nullBitmapOffset = nulls.getAsJsonObject().get("offset").getAsInt();
            nullBitmapBytes = nulls.getAsJsonObject().get("bytes").getAsInt();
        }
        List<Key> ks = new ArrayList<>();
        for (JsonElement e : o.getAsJsonArray("keys")) {
            JsonObject k = e.getAsJsonObject();
            ks.add(new Key(k.get("column").getAsString(), k.get("dtype").getAsString()));
        }
        keys = Collections.unmodifiableList(ks);
        List<Field> fs = new ArrayList<>();
        for (JsonElement e : o.getAsJsonArray("fields")) {
            JsonObject f = e.getAsJsonObject();
            JsonElement bit = f.get("null_bit");
            fs.add(new Field(f.get("column").getAsString(), f.get("dtype").getAsString(),
                    f.get("slot").getAsString(), f.get("offset").getAsInt(),
                    bit == null || bit.isJsonNull() ? -1 : bit.getAsInt()));
        }
        fields = Collections.unmodifiableList(fs);
        check();
    }

    /** Parse and check the layout JSON (the sink table's {@code layout} option). */
    public static SinkLayout parse(String json) {
        try {
            return new SinkLayout(JsonParser.parseString(json).getAsJsonObject());
        } catch (RuntimeException e) {
            if (e instanceof IllegalArgumentException && e.getMessage() != null
                    && e.getMessage().startsWith("layout")) {
                throw e;
            }
            throw new IllegalArgumentException("layout: not a Quiver sink layout (" + e + ")", e);
        }
    }

    public boolean isTiles() {
        return "tiles".equals(kind);
    }

    /** Whether any slot holds a string (whose bytes follow the fixed part). */
    public boolean hasStrings() {
        return fields.stream().anyMatch(f -> "string".equals(f.dtype));
    }

    private static String text(JsonElement e) {
        return e == null || e.isJsonNull() ? null : e.getAsString();
    }

    private void check() {
        if (!"tiles".equals(kind) && !"last".equals(kind)) {
            throw new IllegalArgumentException("layout: kind must be tiles or last, got " + kind);
        }
        if (!(isTiles() ? "tile" : "last").equals(script)) {
            throw new IllegalArgumentException("layout: a " + kind + " view cannot use script " + script);
        }
        if (keys.isEmpty()) {
            throw new IllegalArgumentException("layout: a view needs join keys");
        }
        for (Key k : keys) {
            if (!List.of("int64", "string", "bool").contains(k.dtype)) {
                throw new IllegalArgumentException("layout: join key " + k.column + " has type " + k.dtype);
            }
        }
        for (Field f : fields) {
            int size = slotSize(f.slot);
            if (!f.slot.equals(slotOf(f.dtype))) {
                throw new IllegalArgumentException("layout: slot " + f.slot + " cannot hold " + f.dtype);
            }
            if (f.offset < 0 || f.offset + size > width) {
                throw new IllegalArgumentException("layout: slot " + f.column + " is outside the record");
            }
        }
        if (isTiles() && (eventsColumn == null || hasStrings() != (varLenOffset > 0))) {
            throw new IllegalArgumentException("layout: a tile record needs n_events, and var_len with strings");
        }
    }

    static String slotOf(String dtype) {
        switch (dtype) {
            case "int64":
            case "timestamp":
                return "<i8";
            case "float64":
                return "<f8";
            case "bool":
                return "u1";
            case "string":
                return "<u4";
            default:
                throw new IllegalArgumentException("layout: unknown dtype " + dtype);
        }
    }

    static int slotSize(String slot) {
        switch (slot) {
            case "<i8":
            case "<f8":
                return 8;
            case "<u4":
                return 4;
            case "u1":
                return 1;
            default:
                throw new IllegalArgumentException("layout: unknown slot " + slot);
        }
    }
}
