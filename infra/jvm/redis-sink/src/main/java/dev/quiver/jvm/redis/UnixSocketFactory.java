package dev.quiver.jvm.redis;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.nio.channels.SocketChannel;
import java.nio.file.Path;
import redis.clients.jedis.JedisSocketFactory;
import redis.clients.jedis.exceptions.JedisConnectionException;

/**
 * Jedis over a Unix domain socket ({@code unix:///path/redis.sock}), on Java's own Unix-domain channels (16+):
 * the embedded Redis of a demo or a laptop listens only there (its folder is private to its user). Jedis asks
 * for a {@link Socket}; this one adapts a {@link SocketChannel} and keeps Jedis's read timeout with a selector.
 */
final class UnixSocketFactory implements JedisSocketFactory {
    private final Path path;
    private final int timeoutMs;

    UnixSocketFactory(Path path, int timeoutMs) {
        this.path = path;
        this.timeoutMs = timeoutMs;
    }

    @Override
    public Socket createSocket() {
        try {
            return new ChannelSocket(path, timeoutMs);
        } catch (IOException e) {
            throw new JedisConnectionException("cannot connect to Redis at unix://" + path + ": " + e.getMessage(), e);
        }
    }

    /** The parts of {@link Socket} Jedis uses, over a non-blocking channel read through a selector. */
    static final class ChannelSocket extends Socket {
        private final SocketChannel channel;
        private final Selector reads;
        private final Selector writes;
        private volatile int timeoutMs;

        ChannelSocket(Path path, int timeoutMs) throws IOException {
            this.timeoutMs = timeoutMs;
            channel = SocketChannel.open(StandardProtocolFamily.UNIX);
            try {
                channel.connect(UnixDomainSocketAddress.of(path)); // local: connects or fails at once
                channel.configureBlocking(false);
                reads = Selector.open();
                writes = Selector.open();
                channel.register(reads, SelectionKey.OP_READ);
                channel.register(writes, SelectionKey.OP_WRITE);
            } catch (IOException | RuntimeException e) {
                channel.close();
                throw e;
            }
        }

        @Override
        public InputStream getInputStream() {
            return new InputStream() {
                @Override
                public int read() throws IOException {
                    byte[] one = new byte[1];
                    int n = read(one, 0, 1);
                    return n < 0 ? -1 : one[0] & 0xff;
                }

                @Override
                public int read(byte[] b, int off, int len) throws IOException {
                    ByteBuffer into = ByteBuffer.wrap(b, off, len);
                    while (true) {
                        int n = channel.read(into);
                        if (n != 0 || len == 0) {
                            return n;
                        }
                        if (reads.select(timeoutMs) == 0 && timeoutMs > 0) {
                            throw new SocketTimeoutException("Redis did not answer within " + timeoutMs + " ms");
                        }
                        reads.selectedKeys().clear();
                    }
                }
            };
        }

        @Override
        public OutputStream getOutputStream() {
            return new OutputStream() {
                @Override
                public void write(int b) throws IOException {
                    write(new byte[] {(byte) b}, 0, 1);
                }

                @Override
                public void write(byte[] b, int off, int len) throws IOException {
                    ByteBuffer from = ByteBuffer.wrap(b, off, len);
                    while (from.hasRemaining()) {
                        if (channel.write(from) > 0) {
                            continue;
                        }
                        // The socket's buffer is full (Redis is busy with the pipeline): wait until it drains.
                        if (writes.select(timeoutMs) == 0 && timeoutMs > 0) {
                            throw new SocketTimeoutException("Redis did not read within " + timeoutMs + " ms");
                        }
                        writes.selectedKeys().clear();
                    }
                }
            };
        }

        @Override
        public void setSoTimeout(int timeout) {
            timeoutMs = timeout;
        }

        @Override
        public int getSoTimeout() {
            return timeoutMs;
        }

        // TCP options mean nothing here.
        @Override
        public void setKeepAlive(boolean on) { }

        @Override
        public void setTcpNoDelay(boolean on) { }

        @Override
        public void setReuseAddress(boolean on) { }

        @Override
        public void setSoLinger(boolean on, int linger) { }

        @Override
        public boolean isConnected() {
            return channel.isConnected();
        }

        @Override
        public boolean isBound() {
            return channel.isOpen();
        }

        @Override
        public boolean isClosed() {
            return !channel.isOpen();
        }

        @Override
        public boolean isInputShutdown() {
            return false;
        }

        @Override
        public boolean isOutputShutdown() {
            return false;
        }

        @Override
        public synchronized void close() throws IOException {
            try {
                reads.close();
                writes.close();
            } finally {
                channel.close();
            }
        }
    }
}
