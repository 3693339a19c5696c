package dev.quiver.jvm.parse;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;

import java.util.Arrays;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.data.StringData;
import org.junit.jupiter.api.Test;

/** Lines → reason, event time and values, with the meaning of the JSON_VALUE / TRY_CAST SQL they replace. */
class RecordParserTest {
    static final String SPEC = "user_id:int64,qty:int64,amount:float64,ok:bool,cat:string,at:timestamp";
    static final Double NAN = Double.NaN;

    // line, reason, ts_us, user_id, qty, amount, ok, cat, at
    static final Object[][] CASES = {
        {"{\"ts_us\": 5, \"user_id\": 1, \"qty\": 2, \"amount\": 2.5, \"ok\": true, \"cat\": \"a\", \"at\": 7}",
            null, 5L, 1L, 2L, 2.5, true, "a", 7L},
        {"{\"ts_ms\": 5, \"user_id\": 1}", null, 5000L, 1L, null, null, null, null, null},
        {"{\"ts_us\": 6, \"ts_ms\": 5}", null, 6L, null, null, null, null, null, null},
        // not a JSON object
        {"", "unparseable_json", null, null, null, null, null, null, null},
        {"   ", "unparseable_json", null, null, null, null, null, null, null},
        {"not json", "unparseable_json", null, null, null, null, null, null, null},
        {"[1, 2]", "unparseable_json", null, null, null, null, null, null, null},
        {"5", "unparseable_json", null, null, null, null, null, null, null},
        {"\"x\"", "unparseable_json", null, null, null, null, null, null, null},
        {"{\"ts_us\": 5, \"user_id\": 1", "unparseable_json", null, null, null, null, null, null, null},
        {"{\"ts_us\": 5, \"x\": [1, {\"y\": }]}", "unparseable_json", null, null, null, null, null, null, null},
        {"{\"ts_us\": NaN}", "unparseable_json", null, null, null, null, null, null, null},
        {"{\"ts_us\": 5, \"x\": 1e9999999999}", "unparseable_json", null, null, null, null, null, null, null},
        {"{'ts_us': 5}", "unparseable_json", null, null, null, null, null, null, null},
        {"{\"ts_us\": 012}", "unparseable_json", null, null, null, null, null, null, null},
        {null, "unparseable_json", null, null, null, null, null, null, null},
        // trailing text after the object is never read (Jackson's default, as IS JSON OBJECT)
        {"{\"ts_us\": 5} trailing", null, 5L, null, null, null, null, null, null},
        // the event time
        {"{\"user_id\": 1}", "null_event_ts", null, 1L, null, null, null, null, null},
        {"{\"ts_us\": null, \"ts_ms\": null}", "null_event_ts", null, null, null, null, null, null, null},
        {"{\"ts_us\": {\"a\": 1}}", "null_event_ts", null, null, null, null, null, null, null},
        {"{\"ts_us\": [5]}", "null_event_ts", null, null, null, null, null, null, null},
        {"{\"ts_us\": 5.5}", "bad_type:ts_us", 5L, null, null, null, null, null, null},
        {"{\"ts_us\": 5.0}", "bad_type:ts_us", 5L, null, null, null, null, null, null},
        {"{\"ts_us\": 1e3}", "bad_type:ts_us", null, null, null, null, null, null, null},
        {"{\"ts_us\": \"x\", \"ts_ms\": 7}", "bad_type:ts_us", 7000L, null, null, null, null, null, null},
        {"{\"ts_us\": true}", "bad_type:ts_us", null, null, null, null, null, null, null},
        {"{\"ts_us\": \" 5\"}", "bad_type:ts_us", 5L, null, null, null, null, null, null},
        {"{\"ts_us\": \"+5\"}", "bad_type:ts_us", 5L, null, null, null, null, null, null},
        {"{\"ts_us\": 9223372036854775808}", "bad_type:ts_us", null, null, null, null, null, null, null},
        {"{\"ts_us\": \"5\"}", null, 5L, null, null, null, null, null, null},
        {"{\"ts_us\": -0}", null, 0L, null, null, null, null, null, null},
        {"{\"ts_us\": -9223372036854775808}", null, Long.MIN_VALUE, null, null, null, null, null, null},
        {"{\"ts_us\": 5, \"ts_ms\": 1.5}", "bad_type:ts_ms", 5L, null, null, null, null, null, null},
        {"{\"ts_us\": 1, \"ts_us\": 2}", null, 2L, null, null, null, null, null, null},
        {"{\"ts_us\": 1, \"ts_us\": {}}", "null_event_ts", null, null, null, null, null, null, null},
        // the columns, in order
        {"{\"ts_us\": 5, \"user_id\": 1.5, \"qty\": \"x\"}", "bad_type:user_id", 5L, 1L, null, null, null, null, null},
        {"{\"ts_us\": 5, \"qty\": \"x\", \"user_id\": 1.5}", "bad_type:user_id", 5L, 1L, null, null, null, null, null},
        {"{\"ts_us\": 5, \"user_id\": \"12\"}", null, 5L, 12L, null, null, null, null, null},
        {"{\"ts_us\": 5, \"user_id\": \"012\"}", "bad_type:user_id", 5L, 12L, null, null, null, null, null},
        {"{\"ts_us\": 5, \"qty\": false}", "bad_type:qty", 5L, null, null, null, null, null, null},
        {"{\"ts_us\": 5, \"amount\": \"abc\"}", "bad_type:amount", 5L, null, null, null, null, null, null},
        {"{\"ts_us\": 5, \"amount\": true}", "bad_type:amount", 5L, null, null, null, null, null, null},
        {"{\"ts_us\": 5, \"amount\": \"NaN\"}", null, 5L, null, null, NAN, null, null, null},
        {"{\"ts_us\": 5, \"amount\": \"Infinity\"}", null, 5L, null, null, Double.POSITIVE_INFINITY, null, null, null},
        {"{\"ts_us\": 5, \"amount\": \"-Infinity\"}", null, 5L, null, null, Double.NEGATIVE_INFINITY, null, null, null},
        {"{\"ts_us\": 5, \"amount\": \"1e5\"}", null, 5L, null, null, 1e5, null, null, null},
        {"{\"ts_us\": 5, \"amount\": 1e400}", null, 5L, null, null, Double.POSITIVE_INFINITY, null, null, null},
        {"{\"ts_us\": 5, \"amount\": 3}", null, 5L, null, null, 3.0, null, null, null},
        {"{\"ts_us\": 5, \"amount\": {}}", null, 5L, null, null, null, null, null, null},
        {"{\"ts_us\": 5, \"ok\": \"true\"}", null, 5L, null, null, null, true, null, null},
        {"{\"ts_us\": 5, \"ok\": 1}", "bad_type:ok", 5L, null, null, null, null, null, null},
        {"{\"ts_us\": 5, \"ok\": \"yes\"}", "bad_type:ok", 5L, null, null, null, null, null, null},
        {"{\"ts_us\": 5, \"cat\": 12.50}", null, 5L, null, null, null, null, "12.50", null},
        {"{\"ts_us\": 5, \"cat\": 1e3}", null, 5L, null, null, null, null, "1E+3", null},
        {"{\"ts_us\": 5, \"cat\": true}", null, 5L, null, null, null, null, "true", null},
        {"{\"ts_us\": 5, \"cat\": [\"a\"]}", null, 5L, null, null, null, null, null, null},
        {"{\"ts_us\": 5, \"cat\": \"\\u00e9\\n\"}", null, 5L, null, null, null, null, "\u00e9\n", null},
        {"{\"ts_us\": 5, \"at\": 1.5}", "bad_type:at", 5L, null, null, null, null, null, 1L},
        // a type problem of the event time comes first, then the columns in order
        {"{\"ts_us\": 5.5, \"user_id\": 1.5}", "bad_type:ts_us", 5L, 1L, null, null, null, null, null},
        {"{\"user_id\": 1.5}", "null_event_ts", null, 1L, null, null, null, null, null},
    };

    @Test
    void everyCase() {
        RecordParser parser = new RecordParser(RecordSpec.of(SPEC));
        for (Object[] c : CASES) {
            parser.parse((String) c[0]);
            String what = String.valueOf(c[0]);
            assertEquals(c[1], parser.reason, what);
            assertEquals(c[2], parser.tsUs, what);
            Object[] expected = Arrays.copyOfRange(c, 3, c.length);
            if (c[1] != null) {  // values of a refused line are not read by the job; check the event time only
                continue;
            }
            for (int i = 0; i < expected.length; i++) {
                assertEquals(expected[i], parser.values[i], what + " column " + i);
            }
        }
    }

    @Test
    void lenientLongIsFlinks() {
        assertEquals(12L, RecordParser.toLong("12.5"));
        assertEquals(12L, RecordParser.toLong(" 12 "));
        assertEquals(0L, RecordParser.toLong(".5"));
        assertEquals(12L, RecordParser.toLong("12."));
        assertNull(RecordParser.toLong("-"));
        assertNull(RecordParser.toLong("1E+3"));
        assertNull(RecordParser.toLong("\t12"));
        assertNull(RecordParser.toLong("9223372036854775808"));
        assertEquals(Long.MAX_VALUE, RecordParser.toLong("9223372036854775807"));
    }

    @Test
    void theRowAndTheMemo() {
        ParseRecord f = new ParseRecord();
        StringData spec = StringData.fromString(SPEC);
        StringData line = StringData.fromString("{\"ts_us\": 5, \"user_id\": 1, \"cat\": \"a\"}");
        RowData row = f.eval(line, spec);
        assertNull(row.getString(0));
        assertEquals(5L, row.getLong(1));
        assertEquals(1L, row.getLong(2));
        assertEquals("a", row.getString(6).toString());
        assertSame(row, f.eval(StringData.fromString("{\"ts_us\": 5, \"user_id\": 1, \"cat\": \"a\"}"), spec));
        RowData other = f.eval(StringData.fromString("{\"ts_us\": 6}"), spec);
        assertEquals(6L, other.getLong(1));
        assertEquals("unparseable_json", f.eval(null, spec).getString(0).toString());
    }
}
