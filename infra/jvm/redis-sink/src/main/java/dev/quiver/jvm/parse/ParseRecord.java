package dev.quiver.jvm.parse;

import java.util.Optional;
import org.apache.flink.table.api.DataTypes;
import org.apache.flink.table.catalog.DataTypeFactory;
import org.apache.flink.table.data.GenericRowData;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.data.StringData;
import org.apache.flink.table.data.binary.BinaryStringData;
import org.apache.flink.table.functions.ScalarFunction;
import org.apache.flink.table.types.DataType;
import org.apache.flink.table.types.inference.CallContext;
import org.apache.flink.table.types.inference.StaticArgument;
import org.apache.flink.table.types.inference.TypeInference;

/**
 * {@code quiver_parse(line STRING, spec STRING literal) → ROW<__reason STRING, __ts_us BIGINT, <col> <type>...>}:
 * a Kafka record of the streaming job parsed once on the JVM (see {@link RecordParser} for the exact rules). The
 * row type comes from the literal spec ({@code "user_id:int64,amount:float64,..."}) at planning time.
 *
 * <p>Flink's planner inlines a view's projection into every use (the rowtime computed column, the parsed view,
 * each sink's filter), so one record meets several calls. The last result is memoised per thread: the calls of
 * one record (chained operators run in one thread, one record at a time) compare the line's bytes and return the
 * same immutable row; only the first parses. Deterministic, as the SQL it replaces.
 */
public class ParseRecord extends ScalarFunction {
    private static final long serialVersionUID = 1L;

    private static final ThreadLocal<Memo> MEMO = ThreadLocal.withInitial(Memo::new);

    private transient RecordParser parser;
    private transient StringData specArg;  // the literal the parser was made for (the same object every call)

    private static final class Memo {
        RecordSpec spec;
        BinaryStringData line;  // an owned copy
        RowData row;
    }

    public RowData eval(StringData line, StringData spec) {
        RecordParser p = parser;
        if (p == null || (spec != specArg && !p.spec.text.equals(spec.toString()))) {
            p = parser = new RecordParser(RecordSpec.of(spec.toString()));
        }
        specArg = spec;
        Memo memo = MEMO.get();
        if (memo.spec == p.spec && memo.row != null && (line == null ? memo.line == null : line.equals(memo.line))) {
            return memo.row;
        }
        p.parse(line == null ? null : line.toString());
        RowData row = toRow(p);
        memo.spec = p.spec;
        memo.line = line == null ? null : BinaryStringData.fromBytes(line.toBytes());
        memo.row = row;
        return row;
    }

    static RowData toRow(RecordParser p) {
        Object[] values = p.values;
        GenericRowData row = new GenericRowData(2 + values.length);
        row.setField(0, p.reason == null ? null : StringData.fromString(p.reason));
        row.setField(1, p.tsUs);
        for (int i = 0; i < values.length; i++) {
            Object v = values[i];
            row.setField(2 + i, v instanceof String ? StringData.fromString((String) v) : v);
        }
        return row;
    }

    @Override
    public TypeInference getTypeInference(DataTypeFactory typeFactory) {
        DataType text = DataTypes.STRING().bridgedTo(StringData.class);
        return TypeInference.newBuilder()
                .staticArguments(StaticArgument.scalar("line", text, false), StaticArgument.scalar("spec", text, false))
                .outputTypeStrategy(ParseRecord::outputType)
                .build();
    }

    private static Optional<DataType> outputType(CallContext call) {
        if (!call.isArgumentLiteral(1) || call.isArgumentNull(1)) {
            throw call.newValidationError("quiver_parse: the spec (second argument) must be a string literal");
        }
        String spec = call.getArgumentValue(1, String.class)
                .orElseThrow(() -> call.newValidationError("quiver_parse: unreadable spec"));
        try {
            return Optional.of(RecordSpec.of(spec).rowType());
        } catch (IllegalArgumentException e) {
            throw call.newValidationError(e.getMessage());
        }
    }
}
