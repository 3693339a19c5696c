package dev.quiver.jvm.redis;

import java.time.Duration;
import java.util.List;
import java.util.Set;
import org.apache.flink.configuration.ConfigOption;
import org.apache.flink.configuration.ConfigOptions;
import org.apache.flink.configuration.ReadableConfig;
import org.apache.flink.table.connector.sink.DynamicTableSink;
import org.apache.flink.table.factories.DynamicTableSinkFactory;
import org.apache.flink.table.factories.FactoryUtil;
import org.apache.flink.table.types.logical.LogicalType;
import org.apache.flink.table.types.logical.RowType;

/**
 * {@code 'connector' = 'quiver-redis'}: a view's tiles or last values written straight to the Redis online store.
 * The options come from {@code quiver.online.jvm_sink.sink_options}; the table's columns are those of the
 * view's file sink in compile/flink.py, checked against the layout here, at planning time.
 */
public final class QuiverRedisSinkFactory implements DynamicTableSinkFactory {
    public static final String IDENTIFIER = "quiver-redis";

    public static final ConfigOption<String> REDIS_URL = ConfigOptions.key("redis.url").stringType().noDefaultValue()
            .withDescription("redis://[[user]:password@]host:port/db (rediss:// for TLS), unix:///path.sock[?db=N], or "
                    + "redis+cluster://[[user]:password@]host:port,host:port (a Redis Cluster's seed nodes)");
    public static final ConfigOption<String> VIEW = ConfigOptions.key("view").stringType().noDefaultValue()
            .withDescription("The feature view (must match the layout's).");
    public static final ConfigOption<String> KIND = ConfigOptions.key("kind").stringType().noDefaultValue()
            .withDescription("tiles | last (must match the layout's).");
    public static final ConfigOption<String> LAYOUT = ConfigOptions.key("layout").stringType().noDefaultValue()
            .withDescription("The view's record layout: JSON of quiver.online.jvm_sink.sink_layout.");
    public static final ConfigOption<Integer> BUFFER_ROWS = ConfigOptions.key("buffer.rows").intType()
            .defaultValue(20_000).withDescription("Rows buffered before a write between checkpoints.");
    public static final ConfigOption<String> MARKERS_KEY = ConfigOptions.key("markers.key").stringType()
            .noDefaultValue().withDescription("Redis SET receiving the batch markers (__batch) once written.");
    public static final ConfigOption<Duration> FLUSH_INTERVAL = ConfigOptions.key("flush.interval").durationType()
            .defaultValue(Duration.ZERO).withDescription("Also write what is buffered this often (0: only on "
                    + "checkpoints, at end of input and when buffer.rows wait): how fresh online values are.");
    public static final ConfigOption<Integer> IN_FLIGHT = ConfigOptions.key("write.in-flight").intType()
            .defaultValue(2).withDescription("Flushes written on the sink's own thread at once (the one being "
                    + "written and those queued), while the task goes on; 0: write in the task thread.");
    public static final ConfigOption<Duration> TIMEOUT = ConfigOptions.key("redis.timeout").durationType()
            .defaultValue(Duration.ofSeconds(10)).withDescription("Connect and read timeout of a Redis call.");

    @Override
    public String factoryIdentifier() {
        return IDENTIFIER;
    }

    @Override
    public Set<ConfigOption<?>> requiredOptions() {
        return Set.of(REDIS_URL, VIEW, KIND, LAYOUT);
    }

    @Override
    public Set<ConfigOption<?>> optionalOptions() {
        return Set.of(BUFFER_ROWS, MARKERS_KEY, TIMEOUT, FLUSH_INTERVAL, IN_FLIGHT,
                FactoryUtil.SINK_PARALLELISM);
    }

    @Override
    public DynamicTableSink createDynamicTableSink(Context context) {
        FactoryUtil.TableFactoryHelper helper = FactoryUtil.createTableFactoryHelper(this, context);
        helper.validate();
        ReadableConfig config = helper.getOptions();
        RowType row = (RowType) context.getCatalogTable().getResolvedSchema().toPhysicalRowDataType()
                .getLogicalType();
        List<String> names = row.getFieldNames();
        List<LogicalType> types = row.getChildren();
        SinkOptions options = options(config);
        SinkLayout layout = SinkLayout.parse(options.layoutJson);
        check(config, layout);
        new RowEncoder(layout, names, types); // refuses a table whose columns do not match the layout
        return new QuiverRedisTableSink(options, names, types, config.getOptional(FactoryUtil.SINK_PARALLELISM)
                .orElse(null));
    }

    static SinkOptions options(ReadableConfig config) {
        String url = config.get(REDIS_URL);
        if (!url.startsWith("redis://") && !url.startsWith("rediss://") && !url.startsWith("unix:///")
                && !ClusterRoute.isCluster(url)) {
            String scheme = url.contains("://") ? url.substring(0, url.indexOf("://")) : url;
            throw new IllegalArgumentException("redis.url must be redis://, rediss://, unix:///path or "
                    + "redis+cluster://, got " + scheme + "://");
        }
        int rows = config.get(BUFFER_ROWS);
        if (rows < 1) {
            throw new IllegalArgumentException("buffer.rows must be positive, got " + rows);
        }
        long timeout = config.get(TIMEOUT).toMillis();
        long every = config.get(FLUSH_INTERVAL).toMillis();
        if (every < 0) {
            throw new IllegalArgumentException("flush.interval must not be negative, got " + every + " ms");
        }
        int inFlight = config.get(IN_FLIGHT);
        if (inFlight < 0) {
            throw new IllegalArgumentException("write.in-flight must not be negative, got " + inFlight);
        }
        return new SinkOptions(url, config.get(LAYOUT), config.getOptional(MARKERS_KEY).orElse(null), rows,
                (int) Math.max(1, Math.min(timeout, Integer.MAX_VALUE)), every, inFlight);
    }

    private static void check(ReadableConfig config, SinkLayout layout) {
        if (!layout.view.equals(config.get(VIEW)) || !layout.kind.equals(config.get(KIND))) {
            throw new IllegalArgumentException("the layout is for view " + layout.view + " (" + layout.kind
                    + "), the table says " + config.get(VIEW) + " (" + config.get(KIND) + ")");
        }
    }
}
