"""Throwaway servers for tests and benchmarks: Redis, PostgreSQL, an S3 endpoint, a Spark standalone cluster
(stdlib + redis only; pyspark and moto where those run).

Each server gets its own free port on 127.0.0.1 and its own directory, so tests never touch a
developer's services and parallel workers (pytest-xdist) never collide.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis


class ServiceError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class RedisServer:
    def __init__(self, binary: str, directory: Path, port: int | None = None) -> None:
        self.binary = binary
        self.dir = directory
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=5)

    def start(self, timeout: float = 10.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        log = self.dir / "redis.log"
        # No persistence: a restart test must see an empty server, and nothing is written to disk.
        cmd = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
               "--save", "", "--appendonly", "no", "--logfile", str(log)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                self.proc = None
                raise ServiceError(f"redis-server exited on port {self.port}:\n{_tail(log)}")
            try:
                with self.client() as c:
                    if c.ping():
                        return
            except redis.exceptions.ConnectionError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise ServiceError(f"redis-server did not answer PING within {timeout}s:\n{_tail(log)}")
            time.sleep(0.05)

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections stay open, nothing answers — a stalled Redis."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused server run again (SIGCONT)."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.resume()  # a stopped process would ignore SIGTERM until continued
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


class RedisCluster:
    """A Redis Cluster of `masters` masters with one replica each, made as an operator would
    (`redis-cli --cluster create … --cluster-replicas 1`). Its node timeout is short (a killed master's replica
    takes over within about two seconds) and it serves the slots it still covers when a master is down
    (`cluster-require-full-coverage no`, what docs/serving.md recommends for an online store)."""

    def __init__(self, binary: str, directory: Path, masters: int = 3, node_timeout_ms: int = 1000) -> None:
        self.binary, self.dir, self.node_timeout_ms = binary, directory, node_timeout_ms
        self.ports = [free_port() for _ in range(2 * masters)]
        self.bus_ports = {port: free_port() for port in self.ports}  # not port + 10000: that may be taken
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports[:2])

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)

    def start(self, timeout: float = 60.0) -> None:
        for port in self.ports:
            self.start_node(port)
        create = [shutil.which("redis-cli") or "redis-cli", "--cluster", "create",
                  *(f"127.0.0.1:{p}" for p in self.ports), "--cluster-replicas", "1", "--cluster-yes"]
        out = subprocess.run(create, capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            self.stop()
            raise ServiceError(f"redis-cli --cluster create failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
        self.wait_until_ok(timeout)

    def start_node(self, port: int, timeout: float = 10.0) -> None:
        folder = self.dir / str(port)
        folder.mkdir(parents=True, exist_ok=True)
        cmd = [self.binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder), "--save", "",
               "--appendonly", "no", "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
               "--cluster-port", str(self.bus_ports.setdefault(port, free_port())), "--cluster-node-timeout", str(self.node_timeout_ms), "--cluster-require-full-coverage", "no",
               "--repl-diskless-sync-delay", "0", "--logfile", str(folder / "redis.log")]
        self.procs[port] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with self.client(port) as c:
                    if c.ping():
                        return
            except redis.exceptions.ConnectionError:
                pass
            if self.procs[port].poll() is not None or time.monotonic() > deadline:
                raise ServiceError(f"redis-server (cluster node) did not start on port {port}:\n"
                                   f"{_tail(folder / 'redis.log')}")
            time.sleep(0.05)

    def masters(self) -> list[int]:
        """The ports of the nodes that are masters now, by the view of a live node."""
        for port in self.live():
            with contextlib.suppress(redis.exceptions.RedisError), self.client(port) as c:
                nodes = c.execute_command("CLUSTER", "NODES")
                text = nodes.decode() if isinstance(nodes, bytes) else str(nodes)
                return sorted(int(line.split()[1].split("@")[0].rsplit(":", 1)[1]) for line in text.splitlines()
                              if "master" in line.split()[2] and "fail" not in line.split()[2])
        raise ServiceError("no live node of the cluster")

    def live(self) -> list[int]:
        return [port for port, proc in self.procs.items() if proc.poll() is None]

    def wait_until_ok(self, timeout: float = 60.0) -> None:
        """Until every live node says cluster_state:ok and sees every slot served by a live master, and every
        replica has its master's data (a master killed before that has no replica to take over)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                ok = all(b"cluster_state:ok" in self.client(p).execute_command("CLUSTER", "INFO")
                         for p in self.live())
                ok = ok and all(self._covered(p) for p in self.live())
                ok = ok and all(self._synced(p) for p in self.live())
            except redis.exceptions.RedisError:
                ok = False
            if ok:
                return
            if time.monotonic() > deadline:
                raise ServiceError(f"the Redis Cluster on {self.ports} did not settle within {timeout}s")
            time.sleep(0.1)

    def _synced(self, port: int) -> bool:
        info = self.client(port).info("replication")
        return info.get("role") != "slave" or info.get("master_link_status") == "up"

    def _covered(self, port: int) -> bool:
        live = set(self.live())
        served = 0
        for first, last, master, *_ in self.client(port).execute_command("CLUSTER", "SLOTS"):
            if int(master[1]) in live:
                served += int(last) - int(first) + 1
        return served == 16384

    def kill(self, port: int) -> None:
        """SIGKILL one node: what it had not replicated is lost, as in a crash."""
        proc = self.procs[port]
        proc.kill()
        proc.wait()

    def restart(self, port: int) -> None:
        """Start a killed node again with its cluster config: it rejoins (as a replica once its replica took
        over)."""
        self.start_node(port)

    def flushall(self) -> None:
        for port in self.masters():
            with self.client(port) as c:
                c.flushall()

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


def find_postgres_bin() -> Path | None:
    """Newest /usr/lib/postgresql/N/bin (Debian layout), else whatever initdb is on PATH."""
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                  key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0)
    if dirs:
        return Path(dirs[-1]).parent
    found = shutil.which("initdb")
    return Path(found).resolve().parent if found else None


class PostgresCluster:
    """A private cluster: trust auth, 127.0.0.1 only, unix socket inside its own directory.

    PostgreSQL refuses to run as root, so as root every server command runs as `run_as`
    (an unprivileged user, `postgres` from the Debian package) who owns the directory.
    """

    superuser = "quiver"

    def __init__(self, bindir: Path, run_as: str | None = None, port: int | None = None) -> None:
        self.bindir = bindir
        self.run_as = run_as
        self.port = port or free_port()
        # Not under pytest's tmp dir: that is root-only (0700), and the server user must reach its files.
        self.dir = Path(tempfile.mkdtemp(prefix="quiver-pg-"))
        self.data = self.dir / "data"
        self.sock = self.dir / "sock"
        self.log = self.dir / "postgres.log"
        self.sock.mkdir()
        if run_as:
            pw = pwd.getpwnam(run_as)
            for p in (self.dir, self.sock):
                os.chown(p, pw.pw_uid, pw.pw_gid)

    def _run(self, *args: str, timeout: float = 120) -> None:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self.run_as:
            cmd = [shutil.which("runuser") or "/usr/sbin/runuser", "-u", self.run_as, "--", *cmd]
        res = subprocess.run(cmd, cwd=self.dir, capture_output=True, text=True, timeout=timeout)
        if res.returncode != 0:
            raise ServiceError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout}{res.stderr}\n"
                               f"{_tail(self.log)}")

    def start(self) -> None:
        if not (self.data / "PG_VERSION").exists():
            self._run("initdb", "-D", str(self.data), "-U", self.superuser, "--auth=trust",
                      "-E", "UTF8", "--locale=C", "--no-sync")
        # Durability is pointless for a throwaway cluster; turning it off makes DDL-heavy tests fast.
        opts = (f"-p {self.port} -k {self.sock} -c listen_addresses=127.0.0.1 "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", opts, "-w", "-t", "60", "start")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def cleanup(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql+psycopg://{self.superuser}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self) -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.superuser, name)
        return name

    def drop_database(self, name: str) -> None:
        # --force: a test that leaked a connection pool must not make teardown fail.
        self._run("dropdb", "--force", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.superuser, name)


def postgres_run_as() -> str | None:
    """None when not root; else the unprivileged account to run the server as (raises if none)."""
    if os.geteuid() != 0:
        return None
    for user in (os.environ.get("QUIVER_PG_USER"), "postgres"):
        if user:
            try:
                pwd.getpwnam(user)
                return user
            except KeyError:
                continue
    raise ServiceError("running as root but no unprivileged user 'postgres' exists "
                       "(apt-get install postgresql creates it, or set QUIVER_PG_USER)")


class S3Server:
    """An S3-compatible endpoint on 127.0.0.1: moto's server mode (`moto_server`, pip-installed with the main
    venv). It speaks S3's HTTP API (SigV4, multipart), so pyarrow's S3 client talks to it as to a bucket."""

    access_key, secret_key, region = "quiver-test", "quiver-test-secret", "us-east-1"

    def __init__(self, directory: Path, port: int | None = None) -> None:
        self.dir = directory
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def uri(self, bucket: str, prefix: str = "") -> str:
        """An s3:// URI the artifact store accepts (endpoint and scheme in the query)."""
        path = f"{bucket}/{prefix}".rstrip("/")
        return f"s3://{path}?endpoint_override={self.endpoint}&scheme=http"

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_REGION": self.region, "AWS_DEFAULT_REGION": self.region, "AWS_EC2_METADATA_DISABLED": "true"}

    def start(self, timeout: float = 30.0) -> None:
        binary = Path(sys.executable).with_name("moto_server")
        if not binary.exists():
            raise ServiceError(f"{binary} not found: `make setup` installs moto[s3] with its server")
        log = self.dir / "moto.log"
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([str(binary), "-H", "127.0.0.1", "-p", str(self.port)],
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServiceError(f"moto_server exited:\n{_tail(log)}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise ServiceError(f"moto_server did not listen on {self.port} within {timeout}s:\n{_tail(log)}")

    def create_bucket(self, bucket: str) -> None:
        import pyarrow.fs as pafs

        fs = pafs.S3FileSystem(access_key=self.access_key, secret_key=self.secret_key, region=self.region,
                               endpoint_override=self.endpoint, scheme="http", allow_bucket_creation=True)
        fs.create_dir(bucket)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


class SparkStandalone:
    """A Spark standalone cluster on 127.0.0.1 from the scripts bundled with pyspark: a master and `workers`
    workers (`cores` and `memory` each), each with its own work folder under `folder`, where the daemons' logs
    go too. The daemons inherit this process's environment (S3 credentials, say), and so do their executors;
    `cwd` is theirs (default `folder`). `with SparkStandalone(folder) as cluster:` … `cluster.url`."""

    def __init__(self, folder: Path, workers: int = 1, cores: int = 1, memory: str = "2g",
                 cwd: Path | None = None) -> None:
        self.folder, self.workers, self.cores, self.memory = folder, workers, cores, memory
        self.cwd = cwd or folder
        self.port, self.web = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> SparkStandalone:
        import pyspark

        home = Path(pyspark.__file__).parent
        spark_class = str(home / "bin" / "spark-class")
        env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1"}
        self.folder.mkdir(parents=True, exist_ok=True)
        commands = [[spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                     str(self.port), "--webui-port", str(self.web)]]
        commands += [[spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores",
                      str(self.cores), "--memory", self.memory, "--webui-port", str(free_port()), "--work-dir",
                      str(self.folder / f"worker{i}"), self.url] for i in range(self.workers)]
        try:
            for i, command in enumerate(commands):
                with self._log(i).open("wb") as log:
                    self.procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                                       start_new_session=True, cwd=self.cwd))
                if i == 0:
                    self._wait("the master", lambda: self.status()["status"] == "ALIVE")
            self._wait(f"{self.workers} workers", lambda: self.status()["aliveworkers"] >= self.workers)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _log(self, i: int) -> Path:
        return self.folder / ("master.log" if i == 0 else f"worker{i - 1}.log")

    def status(self) -> dict[str, Any]:
        """The master's JSON status (workers, applications)."""
        import json
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.web}/json/", timeout=10) as response:
            return dict(json.load(response))

    def _wait(self, what: str, check: Any, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                break
            try:
                if check():
                    return
            except OSError:  # the master's web UI is not up yet
                pass
            time.sleep(0.5)
        logs = "\n".join(f"--- {self._log(i).name}\n{_tail(self._log(i))}" for i in range(len(self.procs)))
        state = "a Spark daemon exited" if any(p.poll() is not None for p in self.procs) else "timed out"
        raise ServiceError(f"waiting for {what}: {state}\n{logs}")

    def __exit__(self, *_: Any) -> None:
        for proc in reversed(self.procs):  # workers first: they stop their executors
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def copy_demo_project(root: Path) -> None:
    """The demo project in `root` as a new user has it after `make demo`: the example catalog, quiver.yaml,
    monitoring.yaml, and the repository's venvs linked in (no data)."""
    repo = Path(__file__).resolve().parents[1]
    shutil.copytree(repo / "feature_defs", root / "feature_defs", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("quiver.yaml", "monitoring.yaml"):
        shutil.copy(repo / name, root / name)
    for venv in (".venv", ".venv-stream"):
        assert (repo / venv / "bin" / "python").exists(), f"{venv} is missing: run `make setup`"
        (root / venv).symlink_to(repo / venv)


class TcpProxy:
    """A TCP relay on 127.0.0.1 in front of `target` (host:port) that a test can cut and restore: while cut it
    refuses new connections and resets the open ones, which is what a client sees of a store that went away
    (a network partition, a restart). Threads only; no root, no iptables."""

    def __init__(self, target: str) -> None:
        import threading

        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.port = free_port()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self.restore()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def restore(self) -> None:
        import threading

        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            for conn in self._open:
                with contextlib.suppress(OSError):
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset
                    conn.close()
            self._open.clear()

    close = cut

    def _accept(self, listener: socket.socket) -> None:
        import threading

        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for conn in (source, sink):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._open.discard(source)
