package dev.quiver.jvm.parse;

import java.math.BigDecimal;
import java.math.RoundingMode;
import java.time.OffsetDateTime;
import java.time.format.DateTimeFormatter;
import java.time.format.DateTimeParseException;

/** A named time field's text as epoch microseconds, in the format the source's stream binding states. */
final class EventTime {
    private static final BigDecimal MILLION = BigDecimal.valueOf(1_000_000L);
    private static final BigDecimal THOUSAND = BigDecimal.valueOf(1_000L);

    private EventTime() {}

    /**
     * Epoch µs of {@code text}, or null when it is not a time of that format: epoch_us an integer (the canonical
     * text of a long, as a timestamp column); epoch_ms and epoch_s a number, a fraction allowed, floored to the
     * microsecond; iso8601 a date-time with a zone or offset ({@code Z}, {@code +01:00}; a space may stand for
     * the {@code T}). A time without a zone is refused: which instant it means is a guess.
     */
    static Long micros(String text, RecordSpec.TimeFormat format) {
        switch (format) {
            case EPOCH_US: {
                Long v = RecordParser.toLong(text);
                return v != null && v.toString().equals(text) ? v : null;
            }
            case EPOCH_MS:
                return scaled(text, THOUSAND);
            case EPOCH_S:
                return scaled(text, MILLION);
            default:
                return iso(text);
        }
    }

    private static Long scaled(String text, BigDecimal perUnit) {
        try {
            return new BigDecimal(text).multiply(perUnit).setScale(0, RoundingMode.FLOOR).longValueExact();
        } catch (NumberFormatException | ArithmeticException e) {
            return null;
        }
    }

    private static Long iso(String text) {
        String t = text.length() > 10 && text.charAt(10) == ' ' ? text.substring(0, 10) + 'T' + text.substring(11) : text;
        try {
            OffsetDateTime at = OffsetDateTime.parse(t, DateTimeFormatter.ISO_OFFSET_DATE_TIME);
            return Math.addExact(Math.multiplyExact(at.toEpochSecond(), 1_000_000L), at.getNano() / 1_000L);
        } catch (DateTimeParseException | ArithmeticException e) {
            return null;
        }
    }
}
