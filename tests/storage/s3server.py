"""A real S3 API on 127.0.0.1 for the object-storage tests: moto's server in a child process.

Nothing is downloaded: moto serves S3 (and IAM) from memory.  After set-up, request
authentication is switched on, so the credentials and their policy are enforced: the
test user may do anything except read keys under ``denied/`` and write keys under
``readonly/`` (an explicit Deny, as a bucket administrator would write it).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

POLICY = {
    "Version": "2012-10-17",
    "Statement": [
        {"Effect": "Allow", "Action": "s3:*", "Resource": "*"},
        {"Effect": "Deny", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::*/denied/*"},
        {"Effect": "Deny", "Action": "s3:PutObject", "Resource": "arn:aws:s3:::*/readonly/*"},
    ],
}
REGION = "us-east-1"


def _die_with_parent() -> None:
    """In the server's process (Linux): SIGTERM when the test process dies, even by SIGKILL."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the fixture's teardown stops it
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """moto's server on 127.0.0.1; ``env`` holds what a client needs (endpoint, credentials)."""

    def __init__(self):
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent)
        try:
            self._set_up()
        except BaseException:  # never leave the server running when its set-up fails
            self.stop()
            raise

    def _set_up(self) -> None:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2).read()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("moto's S3 server did not start") from None
                time.sleep(0.1)
        import boto3

        iam = boto3.client("iam", endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id="setup",
                           aws_secret_access_key="setup")
        iam.create_user(UserName="gpu-dedup-tests")
        iam.put_user_policy(UserName="gpu-dedup-tests", PolicyName="tests", PolicyDocument=json.dumps(POLICY))
        key = iam.create_access_key(UserName="gpu-dedup-tests")["AccessKey"]
        self.env = {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
                    "AWS_DEFAULT_REGION": REGION, "AWS_ENDPOINT_URL": self.endpoint}
        # from now on every request is authenticated against IAM: the Deny statements hold
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset-auth", data=b"0", method="POST",
                                     headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(req, timeout=10).read()

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


CLEARED = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE",
           "AWS_ENDPOINT_URL_S3", "GPU_DEDUP_FAULT")


def use(server: S3Server) -> dict:
    """Point this process (and the processes it starts) at ``server``; returns the environment it replaced."""
    saved = {k: os.environ.get(k) for k in (*server.env, *CLEARED)}
    for k in CLEARED:
        os.environ.pop(k, None)
    os.environ.update(server.env)
    return saved


def restore(saved: dict) -> None:
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
