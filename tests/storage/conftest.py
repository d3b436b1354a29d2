import uuid

import pytest

from tests.storage.s3server import S3Server, restore, use


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 API (moto's server) on 127.0.0.1 for this test session; this process and the processes it
    starts use it through the AWS environment variables (endpoint and credentials)."""
    server = S3Server()
    saved = use(server)
    from gpu_dedup.storage import filesystems

    filesystems._FS.clear()  # file systems made before the endpoint was set
    try:
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
    except ImportError:  # pragma: no cover - the test extra installs it
        pass
    try:
        yield server
    finally:
        server.stop()
        restore(saved)
        filesystems._FS.clear()


@pytest.fixture
def bucket(s3_server):
    """A new, empty bucket."""
    name = f"gpu-dedup-{uuid.uuid4().hex[:12]}"
    s3_server.client().create_bucket(Bucket=name)
    return name
