"""quiver.offline.store without a server: parsing offline_root, the errors for bad ones, what Spark is told,
and the manifest commit (on a local pyarrow filesystem standing in for a bucket)."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from quiver.catalog.errors import QuiverError
from quiver.offline.engines import spark_store_conf
from quiver.offline.store import MANIFEST, OfflineStore, open_store

CREDS = {"AWS_ACCESS_KEY_ID": "AKIATESTKEY", "AWS_SECRET_ACCESS_KEY": "s3cr3t-never-shown", "AWS_REGION": "eu-west-1"}


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in CREDS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)


def test_a_folder_stays_a_local_store(tmp_path: Path) -> None:
    store = open_store("data/offline", tmp_path)
    assert store.is_local and store.base == str(tmp_path / "data/offline")
    assert open_store(str(tmp_path / "x"), Path("/elsewhere")).base == str(tmp_path / "x")
    assert open_store(f"file://{tmp_path}/y", Path("/elsewhere")).base == f"{tmp_path}/y"


def test_s3_and_s3a_name_the_same_bucket_and_spark_reads_s3a(aws: None) -> None:
    for root in ("s3://lake/team/offline", "s3a://lake/team/offline/"):
        store = open_store(root, Path("/p"))
        assert (store.scheme, store.base) == ("s3", "lake/team/offline")
        assert store.uri(store.path("v", "tiles")) == "s3://lake/team/offline/v/tiles"
        assert store.uri(store.path("v", "tiles"), spark=True) == "s3a://lake/team/offline/v/tiles"


def test_an_endpoint_comes_from_the_query_or_the_environment(aws: None, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store("s3://lake/x?endpoint_override=127.0.0.1:9000&scheme=http", Path("/p"))
    assert store.endpoint == "http://127.0.0.1:9000"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "https://minio.internal:9000")
    assert open_store("s3://lake/x", Path("/p")).endpoint == "https://minio.internal:9000"


def test_spark_is_told_the_endpoint_never_the_credentials(aws: None, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "jars" / "s3a").mkdir(parents=True)
    (tmp_path / "jars" / "s3a" / "hadoop-aws-3.5.0.jar").write_bytes(b"")
    monkeypatch.setenv("QUIVER_JARS_DIR", str(tmp_path / "jars"))
    conf = spark_store_conf(open_store("s3://lake/x?endpoint_override=127.0.0.1:9000&scheme=http", Path("/p")))
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-1"
    text = repr(conf)
    assert CREDS["AWS_SECRET_ACCESS_KEY"] not in text and CREDS["AWS_ACCESS_KEY_ID"] not in text
    assert spark_store_conf(None) == {} and spark_store_conf(open_store("local", tmp_path)) == {}


def test_missing_s3a_jars_say_how_to_get_them(aws: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUIVER_JARS_DIR", str(tmp_path / "none"))
    with pytest.raises(QuiverError, match=r"s3://lake/x: the s3a jars are missing .* scripts/jars\.sh s3a"):
        spark_store_conf(open_store("s3://lake/x", Path("/p")))


@pytest.mark.parametrize(("root", "message"), [
    ("ftp://host/data", r"offline_root 'ftp://host/data': unknown URI scheme 'ftp'; use a folder, s3://"),
    ("s3:///no-bucket", r"offline_root 's3:///no-bucket': no bucket"),
    ("s3://lake/x?secret_key=abc", r"offline_root s3://lake/x: unknown option\(s\) secret_key"),
])
def test_bad_roots_are_named(aws: None, root: str, message: str) -> None:
    with pytest.raises(QuiverError, match=message):
        open_store(root, Path("/p"))


def test_credentials_in_the_uri_are_refused_without_echoing_them(aws: None) -> None:
    with pytest.raises(QuiverError, match="credentials do not belong in the URI") as caught:
        open_store("s3://AKIAX:topsecret@lake/x", Path("/p"))
    assert "topsecret" not in str(caught.value)


def test_no_credentials_anywhere_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(QuiverError, match=r"offline_root s3://lake/x: no AWS credentials found; set AWS_ACCESS_KEY_ID"):
        open_store("s3://lake/x", Path("/p"))


def _bucket(tmp_path: Path) -> OfflineStore:
    """An object-store OfflineStore whose 'bucket' is a local folder: the manifest logic is the same."""
    return OfflineStore("s3://lake/x", pafs.LocalFileSystem(), str(tmp_path / "lake"), "s3")


def _stage(store: OfflineStore, name: str, values: list[int]) -> str:
    path = store.path(".staging", name)
    store.fs.create_dir(store.path(".staging"))
    pq.write_table(pa.table({"v": values}), path, filesystem=store.fs)
    return path


def test_a_day_is_what_its_manifest_names_and_a_new_commit_replaces_it_whole(tmp_path: Path) -> None:
    store = _bucket(tmp_path)
    folder = store.path("view", "tiles", "date=2026-11-01")
    store.fs.create_dir(folder)
    assert store.partition_days("view", "tiles") == [] and store.partition_files(folder) == []
    pq.write_table(pa.table({"v": [9]}), f"{folder}/stray.parquet", filesystem=store.fs)
    assert store.partition_days("view", "tiles") == []  # files without a manifest are not a day
    store.commit(folder, [_stage(store, "a.parquet", [1, 2]), _stage(store, "b.parquet", [3])], rows=3)
    assert store.partition_days("view", "tiles") == [date(2026, 11, 1)]
    first = store.partition_files(folder)
    assert sorted(pq.read_table(first, filesystem=store.fs)["v"].to_pylist()) == [1, 2, 3]
    assert store.read_manifest(folder)["rows"] == 3  # type: ignore[index]
    store.commit(folder, [_stage(store, "c.parquet", [7])], rows=1)
    second = store.partition_files(folder)
    assert [pq.read_table(f, filesystem=store.fs)["v"].to_pylist() for f in second] == [[7]]
    left = sorted(Path(folder).iterdir())
    assert [p.name for p in left] == sorted([MANIFEST, *(Path(f).name for f in second)])  # old files deleted
    store.remove(folder)
    assert store.partition_days("view", "tiles") == [] and not list(Path(folder).glob("*"))


def test_duckdb_reads_one_endpoint_per_scheme_and_names_both(aws: None) -> None:
    """A source and the offline root on two S3 endpoints cannot both answer to s3:// in one DuckDB run."""
    from quiver.catalog.locations import open_location
    from quiver.offline.engines import DuckDBEngine

    engine = DuckDBEngine()
    try:
        engine.attach(open_store("s3://lake/offline?endpoint_override=minio:9000&scheme=http", Path("/p")))
        engine.attach(open_location("s3://lake/events?endpoint_override=minio:9000&scheme=http", Path("/p")))
        engine.attach(open_location("local/events", Path("/p")))  # a folder needs nothing
        with pytest.raises(QuiverError, match=r"one s3:// endpoint per run: s3://lake/events is on AWS, "
                                              r"another root on http://minio:9000"):
            engine.attach(open_location("s3://lake/events", Path("/p"), "source 'tx' path"))
    finally:
        engine.close()


def test_a_source_uri_names_its_source_in_errors(aws: None) -> None:
    from quiver.catalog.schema import source_location

    with pytest.raises(QuiverError, match=r"source 'tx' path 'gopher://x/y': unknown URI scheme 'gopher'"):
        source_location("gopher://x/y", Path("/p"), "source 'tx' path")
