package dev.quiver.jvm.parse;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;

import org.junit.jupiter.api.Test;

/** Event time from a named field in the binding's format, or from outside the record. */
class EventTimeTest {
    // 2026-12-07T10:15:00.250Z
    static final long AT_US = 1_796_638_500_250_000L;

    static RecordParser parsed(String spec, String line) {
        RecordParser p = new RecordParser(RecordSpec.of(spec));
        p.parse(line);
        return p;
    }

    static void assertTime(String spec, String line, Long tsUs, String reason) {
        RecordParser p = parsed(spec, line);
        assertEquals(reason, p.reason, line);
        assertEquals(tsUs, p.tsUs, line);
    }

    @Test
    void epochUnits() {
        assertTime("@at=epoch_s;user_id:int64", "{\"at\": 1796638500.25, \"user_id\": 1}", AT_US, null);
        assertTime("@at=epoch_s;user_id:int64", "{\"at\": 1796638500}", AT_US - 250_000, null);
        assertTime("@at=epoch_ms;user_id:int64", "{\"at\": 1796638500250}", AT_US, null);
        assertTime("@at=epoch_ms;user_id:int64", "{\"at\": \"1796638500250.9\"}", AT_US + 900, null);
        assertTime("@at=epoch_us;user_id:int64", "{\"at\": 1796638500250000}", AT_US, null);
        assertTime("@at=epoch_us;user_id:int64", "{\"at\": 1.5}", null, "bad_type:at");
        assertTime("@at=epoch_ms;user_id:int64", "{\"at\": \"soon\"}", null, "bad_type:at");
        assertTime("@at=epoch_s;user_id:int64", "{\"at\": 1e30}", null, "bad_type:at");  // beyond a long of µs
        assertTime("@at=epoch_s;user_id:int64", "{\"at\": -1.5}", -1_500_000L, null);
    }

    @Test
    void iso8601NeedsAZone() {
        String spec = "@at=iso8601;user_id:int64";
        assertTime(spec, "{\"at\": \"2026-12-07T10:15:00.250Z\"}", AT_US, null);
        assertTime(spec, "{\"at\": \"2026-12-07T11:15:00.25+01:00\"}", AT_US, null);
        assertTime(spec, "{\"at\": \"2026-12-07 10:15:00.250Z\"}", AT_US, null);
        assertTime(spec, "{\"at\": \"2026-12-07T10:15:00.250123Z\"}", AT_US + 123, null);
        assertTime(spec, "{\"at\": \"2026-12-07T10:15:00\"}", null, "bad_type:at");
        assertTime(spec, "{\"at\": 1796638500}", null, "bad_type:at");
    }

    @Test
    void theNamedFieldOnly() {
        String spec = "@at=epoch_ms;user_id:int64";
        assertTime(spec, "{\"ts_us\": 5, \"user_id\": 1}", null, "null_event_ts");
        RecordParser p = parsed(spec, "{\"at\": 1000, \"user_id\": \"x\"}");
        assertEquals("bad_type:user_id", p.reason);
        assertEquals(1_000_000L, p.tsUs);
    }

    @Test
    void timeOutsideTheRecord() {
        RecordParser p = parsed("@;user_id:int64", "{\"user_id\": 3}");
        assertNull(p.reason);
        assertNull(p.tsUs);
        assertEquals(3L, p.values[0]);
        assertEquals("unparseable_json", parsed("@;user_id:int64", "nope").reason);
    }

    @Test
    void badClauses() {
        assertThrows(IllegalArgumentException.class, () -> RecordSpec.of("@at=fortnights;user_id:int64"));
        assertThrows(IllegalArgumentException.class, () -> RecordSpec.of("@at;user_id:int64"));
        assertThrows(IllegalArgumentException.class, () -> RecordSpec.of("@at=epoch_s,user_id:int64"));
        assertThrows(IllegalArgumentException.class, () -> RecordSpec.of("@user_id=epoch_s;user_id:int64"));
    }
}
