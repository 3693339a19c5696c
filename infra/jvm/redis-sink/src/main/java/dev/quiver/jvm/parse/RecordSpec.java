package dev.quiver.jvm.parse;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.flink.table.api.DataTypes;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.types.DataType;

/**
 * The columns one Kafka source's records are parsed into: {@code "name:dtype,name:dtype,..."} with the catalog's
 * dtypes (int64, float64, bool, string, timestamp as epoch µs). Specs are interned: every function instance of one
 * source shares one object, so the per-thread memo of {@link ParseRecord} compares them by reference.
 */
final class RecordSpec {
    static final String REASON = "__reason";
    static final String TS_US = "__ts_us";
    static final String TIME_FIELD = "ts_us";
    static final String LEGACY_TIME_FIELD = "ts_ms";

    enum Kind { INT, DOUBLE, BOOL, STRING }

    private static final Map<String, RecordSpec> INTERNED = new ConcurrentHashMap<>();

    /** Where the event time comes from: ts_us/ts_ms, one named field, or outside the record (its Kafka timestamp). */
    enum TimeMode { DEFAULT, FIELD, OUTSIDE }

    /** How a named time field is read: epoch seconds, milliseconds, microseconds, or ISO-8601 text with a zone. */
    enum TimeFormat { EPOCH_S, EPOCH_MS, EPOCH_US, ISO8601 }

    final String text;
    final String[] names;
    final Kind[] kinds;
    final String[] badType;  // "bad_type:<col>" per column, null for strings (never a type problem)
    final TimeMode timeMode;
    final TimeFormat timeFormat;  // FIELD only
    final String badTime;  // FIELD only: "bad_type:<field>"
    /** JSON field → slot: 0 ts_us (or the named time field), 1 ts_ms, 2 + i column i. */
    final Map<String, Integer> slots;

    /**
     * {@code text}: the columns, optionally after a time clause: {@code "@<field>=<format>;"} (a named field;
     * format epoch_s, epoch_ms, epoch_us or iso8601) or {@code "@;"} (the time is not in the record).
     */
    private RecordSpec(String text) {
        this.text = text;
        String columns = text;
        String timeField = null;
        TimeMode mode = TimeMode.DEFAULT;
        TimeFormat format = TimeFormat.EPOCH_US;
        if (text.startsWith("@")) {
            int semi = text.indexOf(';');
            if (semi < 0) {
                throw new IllegalArgumentException("quiver_parse: time clause without ';' in " + text);
            }
            String clause = text.substring(1, semi);
            columns = text.substring(semi + 1);
            if (clause.isEmpty()) {
                mode = TimeMode.OUTSIDE;
            } else {
                int eq = clause.indexOf('=');
                if (eq <= 0) {
                    throw new IllegalArgumentException("quiver_parse: bad time clause " + clause + " in " + text);
                }
                mode = TimeMode.FIELD;
                timeField = clause.substring(0, eq);
                format = timeFormat(clause.substring(eq + 1));
            }
        }
        this.timeMode = mode;
        this.timeFormat = format;
        this.badTime = timeField == null ? null : "bad_type:" + timeField;
        List<String> names = new ArrayList<>();
        List<Kind> kinds = new ArrayList<>();
        if (!columns.isEmpty()) {
            for (String part : columns.split(",")) {
                int colon = part.indexOf(':');
                if (colon <= 0) {
                    throw new IllegalArgumentException("quiver_parse: bad column spec " + part + " in " + text);
                }
                names.add(part.substring(0, colon));
                kinds.add(kind(part.substring(colon + 1)));
            }
        }
        this.names = names.toArray(new String[0]);
        this.kinds = kinds.toArray(new Kind[0]);
        this.badType = new String[this.names.length];
        this.slots = new HashMap<>();
        if (mode == TimeMode.DEFAULT) {
            slots.put(TIME_FIELD, 0);
            slots.put(LEGACY_TIME_FIELD, 1);
        } else if (mode == TimeMode.FIELD) {
            slots.put(timeField, 0);
        }
        for (int i = 0; i < this.names.length; i++) {
            String name = this.names[i];
            if (slots.containsKey(name) || name.equals(REASON) || name.equals(TS_US)) {
                throw new IllegalArgumentException("quiver_parse: column " + name + " is reserved or repeated");
            }
            slots.put(name, 2 + i);
            badType[i] = this.kinds[i] == Kind.STRING ? null : "bad_type:" + name;
        }
    }

    static RecordSpec of(String text) {
        return INTERNED.computeIfAbsent(text, RecordSpec::new);
    }

    private static TimeFormat timeFormat(String name) {
        switch (name) {
            case "epoch_s":
                return TimeFormat.EPOCH_S;
            case "epoch_ms":
                return TimeFormat.EPOCH_MS;
            case "epoch_us":
                return TimeFormat.EPOCH_US;
            case "iso8601":
                return TimeFormat.ISO8601;
            default:
                throw new IllegalArgumentException("quiver_parse: unknown time format " + name);
        }
    }

    private static Kind kind(String dtype) {
        switch (dtype) {
            case "int64":
            case "timestamp":
                return Kind.INT;
            case "float64":
                return Kind.DOUBLE;
            case "bool":
                return Kind.BOOL;
            case "string":
                return Kind.STRING;
            default:
                throw new IllegalArgumentException("quiver_parse: unknown dtype " + dtype);
        }
    }

    /** ROW<__reason STRING, __ts_us BIGINT, col TYPE...>, produced as RowData. */
    DataType rowType() {
        List<DataTypes.Field> fields = new ArrayList<>();
        fields.add(DataTypes.FIELD(REASON, DataTypes.STRING()));
        fields.add(DataTypes.FIELD(TS_US, DataTypes.BIGINT()));
        for (int i = 0; i < names.length; i++) {
            fields.add(DataTypes.FIELD(names[i], sqlType(kinds[i])));
        }
        return DataTypes.ROW(fields.toArray(new DataTypes.Field[0])).bridgedTo(RowData.class);
    }

    private static DataType sqlType(Kind kind) {
        switch (kind) {
            case INT:
                return DataTypes.BIGINT();
            case DOUBLE:
                return DataTypes.DOUBLE();
            case BOOL:
                return DataTypes.BOOLEAN();
            default:
                return DataTypes.STRING();
        }
    }
}
