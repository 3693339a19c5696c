package dev.quiver.jvm.parse;

import java.io.IOException;
import java.util.Arrays;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.core.JsonFactory;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.core.JsonParser;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.core.JsonToken;

/**
 * One Kafka record parsed once, with exactly the meaning the SQL it replaces had (JSON_VALUE, TRY_CAST and the
 * checks of platform/quiver/compile/flink_sources.py):
 *
 * <ul>
 *   <li>A field's raw text is what Flink's {@code JSON_VALUE(line, '$.f')} returns: the line is read by Jackson
 *       (the same shaded parser, defaults, trailing text ignored, the last of duplicate keys wins) into untyped
 *       values with floats as BigDecimal, and the value's {@code String.valueOf}: a JSON string's text, an integer's
 *       digits ({@code -0} is {@code 0}), a float's BigDecimal text ({@code 1e3} is {@code 1E+3}), {@code true} or
 *       {@code false}; null for JSON null, a missing field, an object or an array.
 *   <li>{@code TRY_CAST(raw AS BIGINT)} is Flink's string to long: spaces trimmed, a sign, digits, and a fraction
 *       of digits that is cut off ({@code 12.5} is 12); out of range is null. An int64/timestamp column must be the
 *       canonical text of that long (so {@code 12.5} and {@code 012} are bad types, the string {@code "12"} is not).
 *   <li>{@code TRY_CAST(raw AS DOUBLE)} is {@code Double.parseDouble} (which takes "NaN", "Infinity", "1e5").
 *   <li>A bool column is only the text {@code true} or {@code false}.
 * </ul>
 *
 * The reason is the first of: unparseable_json (not a JSON object), null_event_ts (neither ts_us nor ts_ms),
 * bad_type:ts_us, bad_type:ts_ms, bad_type:&lt;col&gt; in column order; contract checks and the future check stay in
 * SQL. A spec that names its time field reads only that field ({@link EventTime}: null_event_ts when it is missing,
 * bad_type:&lt;field&gt; when unreadable); a spec whose time is outside the record reads none ({@code tsUs} null). {@code tsUs} is {@code COALESCE(TRY_CAST(ts_us AS BIGINT), TRY_CAST(ts_ms AS BIGINT) * 1000)}, set for every
 * parseable record (the rowtime of a record with a problem still feeds the watermark, as before).
 *
 * <p>Not thread-safe: one instance per function instance. One streaming pass over the line; no regex.
 */
final class RecordParser {
    static final String UNPARSEABLE = "unparseable_json";
    static final String NULL_EVENT_TS = "null_event_ts";
    static final String BAD_TS_US = "bad_type:ts_us";
    static final String BAD_TS_MS = "bad_type:ts_ms";

    private static final JsonFactory FACTORY = new JsonFactory();

    final RecordSpec spec;
    private final String[] raw;  // per slot: the JSON_VALUE text, or null
    // The result of the last parse:
    String reason;
    Long tsUs;
    final Object[] values;  // Long, Double, Boolean or String per column (null when absent or not of the type)

    RecordParser(RecordSpec spec) {
        this.spec = spec;
        this.raw = new String[2 + spec.names.length];
        this.values = new Object[spec.names.length];
    }

    void parse(String line) {
        Arrays.fill(raw, null);
        Arrays.fill(values, null);
        tsUs = null;
        if (line == null || !readObject(line)) {
            reason = UNPARSEABLE;
            return;
        }
        reason = null;
        if (spec.timeMode == RecordSpec.TimeMode.DEFAULT) {
            Long us = toLong(raw[0]);
            Long ms = toLong(raw[1]);
            tsUs = us != null ? us : ms != null ? Long.valueOf(ms * 1000) : null;
            if (raw[0] == null && raw[1] == null) {
                reason = NULL_EVENT_TS;
            } else if (raw[0] != null && !canonical(raw[0], us)) {
                reason = BAD_TS_US;
            } else if (raw[1] != null && !canonical(raw[1], ms)) {
                reason = BAD_TS_MS;
            }
        } else if (spec.timeMode == RecordSpec.TimeMode.FIELD) {
            if (raw[0] == null) {
                reason = NULL_EVENT_TS;
            } else {
                tsUs = EventTime.micros(raw[0], spec.timeFormat);
                if (tsUs == null) {
                    reason = spec.badTime;
                }
            }
        }
        for (int i = 0; i < values.length; i++) {
            String text = raw[2 + i];
            if (text == null) {
                continue;
            }
            boolean bad;
            switch (spec.kinds[i]) {
                case INT: {
                    Long v = toLong(text);
                    values[i] = v;
                    bad = !canonical(text, v);
                    break;
                }
                case DOUBLE: {
                    Double v = toDouble(text);
                    values[i] = v;
                    bad = v == null;
                    break;
                }
                case BOOL:
                    values[i] = text.equals("true") ? Boolean.TRUE : text.equals("false") ? Boolean.FALSE : null;
                    bad = values[i] == null;
                    break;
                default:
                    values[i] = text;
                    bad = false;
            }
            if (bad && reason == null) {
                reason = spec.badType[i];
            }
        }
    }

    /** Fills `raw` from a JSON object; false when the line is not one (or not valid JSON up to its end). */
    private boolean readObject(String line) {
        try (JsonParser p = FACTORY.createParser(line)) {
            if (p.nextToken() != JsonToken.START_OBJECT) {
                return false;  // empty, a scalar or an array: IS JSON OBJECT is false whatever follows
            }
            JsonToken t;
            while ((t = p.nextToken()) == JsonToken.FIELD_NAME) {
                Integer slot = spec.slots.get(p.currentName());
                JsonToken value = p.nextToken();
                if (slot == null) {
                    skip(p, value);
                } else {
                    raw[slot] = text(p, value);
                }
            }
            return t == JsonToken.END_OBJECT;  // the root object closed; what follows it is never read
        } catch (IOException | RuntimeException e) {
            return false;
        }
    }

    private static String text(JsonParser p, JsonToken value) throws IOException {
        switch (value) {
            case VALUE_STRING:
                return p.getText();
            case VALUE_NUMBER_INT:
                return p.getNumberValue().toString();  // Integer, Long or BigInteger, as the untyped reader
            case VALUE_NUMBER_FLOAT:
                return p.getDecimalValue().toString();  // USE_BIG_DECIMAL_FOR_FLOATS, as Flink's JSON functions
            case VALUE_TRUE:
                return "true";
            case VALUE_FALSE:
                return "false";
            case START_OBJECT:
            case START_ARRAY:
                skip(p, value);
                return null;  // JSON_VALUE (lax) of a non-scalar is empty
            default:
                return null;
        }
    }

    /**
     * Past one value, tokenising it all (a syntax error anywhere makes the line unparseable) and decoding its
     * floats as the untyped reader does: a float BigDecimal refuses (1e9999999999) fails the whole line there too.
     */
    private static void skip(JsonParser p, JsonToken value) throws IOException {
        int depth = 0;
        JsonToken t = value;
        while (true) {
            if (t == JsonToken.START_OBJECT || t == JsonToken.START_ARRAY) {
                depth++;
            } else if (t == JsonToken.END_OBJECT || t == JsonToken.END_ARRAY) {
                depth--;
            } else if (t == JsonToken.VALUE_NUMBER_FLOAT) {
                p.getDecimalValue();
            } else if (t == null) {
                throw new IOException("unexpected end of input");
            }
            if (depth == 0) {
                return;
            }
            t = p.nextToken();
        }
    }

    private static boolean canonical(String text, Long value) {
        return value != null && value.toString().equals(text);
    }

    static Double toDouble(String text) {
        try {
            return Double.valueOf(text);
        } catch (NumberFormatException e) {
            return null;
        }
    }

    /** Flink's TRY_CAST(string AS BIGINT): BinaryStringData.trim() then BinaryStringDataUtil.toLong. */
    static Long toLong(String text) {
        if (text == null) {
            return null;
        }
        int start = 0;
        int end = text.length();
        while (start < end && text.charAt(start) == ' ') {
            start++;
        }
        while (end > start && text.charAt(end - 1) == ' ') {
            end--;
        }
        int size = end - start;
        if (size == 0) {
            return null;
        }
        int i = start;
        char b = text.charAt(i);
        boolean negative = b == '-';
        if (negative || b == '+') {
            i++;
            if (size == 1) {
                return null;
            }
        }
        long result = 0;
        long stopValue = Long.MIN_VALUE / 10;
        while (i < end) {
            b = text.charAt(i);
            i++;
            if (b == '.') {
                break;
            }
            if (b < '0' || b > '9') {
                return null;
            }
            if (result < stopValue) {
                return null;
            }
            result = result * 10 - (b - '0');
            if (result > 0) {
                return null;
            }
        }
        while (i < end) {
            b = text.charAt(i);
            if (b < '0' || b > '9') {
                return null;
            }
            i++;
        }
        if (!negative) {
            result = -result;
            if (result < 0) {
                return null;
            }
        }
        return result;
    }
}
