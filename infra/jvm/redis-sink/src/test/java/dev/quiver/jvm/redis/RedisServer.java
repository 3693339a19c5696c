package dev.quiver.jvm.redis;

import java.io.File;
import java.io.IOException;
import java.net.ServerSocket;
import java.nio.file.Files;
import java.nio.file.Path;
import redis.clients.jedis.Jedis;
import redis.clients.jedis.exceptions.JedisConnectionException;

/** A private redis-server on a free port (as tests/harness.py starts one); missing redis-server fails, never skips. */
final class RedisServer implements AutoCloseable {
    final int port;
    final Path socket; // also listening here (unix:// URLs)
    private final Process process;

    RedisServer() throws IOException, InterruptedException {
        String binary = System.getenv().getOrDefault("REDIS_SERVER", "redis-server");
        try (ServerSocket socket = new ServerSocket(0)) {
            port = socket.getLocalPort();
        }
        Path dir = Files.createTempDirectory("quiver-redis-sink");
        socket = dir.resolve("redis.sock");
        ProcessBuilder builder = new ProcessBuilder(binary, "--port", Integer.toString(port), "--bind", "127.0.0.1",
                "--unixsocket", socket.toString(), "--unixsocketperm", "700",
                "--save", "", "--appendonly", "no", "--dir", dir.toString());
        builder.redirectErrorStream(true).redirectOutput(dir.resolve("redis.log").toFile());
        try {
            process = builder.start();
        } catch (IOException e) {
            throw new IOException("redis-server not found (run `make setup`, or set REDIS_SERVER)", e);
        }
        for (int i = 0; i < 200; i++) {
            try (Jedis j = client()) {
                j.ping();
                return;
            } catch (JedisConnectionException e) {
                if (!process.isAlive()) {
                    throw new IOException("redis-server exited: see " + dir + File.separator + "redis.log");
                }
                Thread.sleep(25);
            }
        }
        close();
        throw new IOException("redis-server did not answer on port " + port);
    }

    String url() {
        return "redis://127.0.0.1:" + port + "/0";
    }

    String unixUrl() {
        return "unix://" + socket;
    }

    Jedis client() {
        return new Jedis("127.0.0.1", port);
    }

    @Override
    public void close() {
        process.destroy();
    }
}
