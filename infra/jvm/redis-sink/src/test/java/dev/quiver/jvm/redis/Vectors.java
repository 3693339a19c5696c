package dev.quiver.jvm.redis;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.apache.flink.table.data.GenericRowData;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.data.StringData;
import org.apache.flink.table.types.logical.BigIntType;
import org.apache.flink.table.types.logical.BooleanType;
import org.apache.flink.table.types.logical.DoubleType;
import org.apache.flink.table.types.logical.LogicalType;
import org.apache.flink.table.types.logical.LogicalTypeRoot;
import org.apache.flink.table.types.logical.VarCharType;

/** tests/vectors/online_records.json (made by the Python codec): layouts, sink rows, the expected writes. */
final class Vectors {
    /** One vector: its layout, its rows as the sink table holds them, and what the loader writes. */
    static final class Vector {
        final String name;
        final SinkLayout layout;
        final List<String> names = new ArrayList<>();
        final List<LogicalType> types = new ArrayList<>();
        final List<RowData> rows = new ArrayList<>();
        final JsonObject json;

        Vector(JsonObject v) {
            json = v;
            name = v.get("name").getAsString();
            layout = SinkLayout.parse(v.get("layout").toString());
            for (Map.Entry<String, LogicalTypeRoot> c : RowEncoder.expectedColumns(layout).entrySet()) {
                names.add(c.getKey());
                types.add(typeOf(c.getValue()));
            }
            for (JsonElement r : v.getAsJsonArray("rows")) {
                rows.add(row(r.getAsJsonObject()));
            }
        }

        RowEncoder encoder() {
            return new RowEncoder(layout, names, types);
        }

        private RowData row(JsonObject values) {
            GenericRowData row = new GenericRowData(names.size());
            for (int i = 0; i < names.size(); i++) {
                JsonElement v = values.get(names.get(i));
                if (v == null || v.isJsonNull()) {
                    continue;
                }
                switch (types.get(i).getTypeRoot()) {
                    case BIGINT:
                        row.setField(i, v.getAsLong());
                        break;
                    case DOUBLE: // non-finite floats are spelled as strings in JSON
                        row.setField(i, v.getAsJsonPrimitive().isString()
                                ? Double.parseDouble(v.getAsString()) : v.getAsDouble());
                        break;
                    case BOOLEAN:
                        row.setField(i, v.getAsBoolean());
                        break;
                    default:
                        row.setField(i, StringData.fromString(v.getAsString()));
                }
            }
            return row;
        }
    }

    static LogicalType typeOf(LogicalTypeRoot root) {
        switch (root) {
            case BIGINT:
                return new BigIntType();
            case DOUBLE:
                return new DoubleType();
            case BOOLEAN:
                return new BooleanType();
            default:
                return new VarCharType(VarCharType.MAX_LENGTH);
        }
    }

    static Path path() {
        String configured = System.getProperty("quiver.vectors");
        return Path.of(configured != null ? configured : "../../../tests/vectors/online_records.json");
    }

    static List<Vector> load() throws IOException {
        JsonObject doc = JsonParser.parseString(Files.readString(path(), StandardCharsets.UTF_8)).getAsJsonObject();
        List<Vector> out = new ArrayList<>();
        for (JsonElement v : doc.getAsJsonArray("vectors")) {
            out.add(new Vector(v.getAsJsonObject()));
        }
        return out;
    }

    private Vectors() {}
}
