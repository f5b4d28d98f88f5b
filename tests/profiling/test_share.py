"""Share: a fake HfApi at the one seam; URLs formed, errors mapped, the token never shown."""

import logging
import urllib.parse

import pytest

from profiling.share import ShareError, share_trace, valid_repo_id

TOKEN = "hf_SecretTokenValue1234567890"


class FakeApi:
    """Records calls like HfApi would receive them; optionally fails like the Hub."""

    def __init__(self, token, fail_status=None):
        self.token, self.calls, self.fail_status = token, [], fail_status

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id, kwargs))

    def upload_file(self, **kwargs):
        self.calls.append(("upload_file", kwargs))
        if self.fail_status:
            response = type("Response", (), {"status_code": self.fail_status})()
            error = RuntimeError(f"{self.fail_status} Client Error for token {self.token}")
            error.response = response
            raise error


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "naive_float32_run.json"
    path.write_text('{"traceEvents": []}')
    return path


def test_uploads_and_forms_the_perfetto_link(trace):
    apis = []
    links = share_trace(trace, "alice/traces", TOKEN, api_factory=lambda t: apis.append(FakeApi(t)) or apis[-1])
    api = apis[0]
    assert api.token == TOKEN
    assert [call[0] for call in api.calls] == ["upload_file"]  # never create_repo: it needs manage-repos
    upload = api.calls[0][1]
    assert upload["path_in_repo"] == "traces/naive_float32_run.json" and upload["repo_id"] == "alice/traces"
    assert links["url"] == "https://huggingface.co/datasets/alice/traces/resolve/main/traces/naive_float32_run.json"
    assert links["perfetto_url"] == "https://ui.perfetto.dev/#!/?url=" + urllib.parse.quote(links["url"], safe="")
    assert "public" in links["note"]


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (401, "^token: the Hub refused it"),
        (403, "^token: the Hub refused it"),
        (404, "^repo_id: alice/traces was not found; create it first as a public dataset"),
        (500, "^share: the Hub answered HTTP 500"),
    ],
)
def test_hub_errors_become_clear_messages_without_the_token(trace, status, message, caplog):
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ShareError, match=message) as err:
        share_trace(trace, "alice/traces", TOKEN, api_factory=lambda t: FakeApi(t, fail_status=status))
    assert TOKEN not in str(err.value)
    assert TOKEN not in caplog.text


def test_network_failure(trace):
    class Offline(FakeApi):
        def upload_file(self, **kwargs):
            raise ConnectionError(f"cannot connect with {self.token}")

    with pytest.raises(ShareError, match="could not reach the Hugging Face Hub") as err:
        share_trace(trace, "alice/traces", TOKEN, api_factory=Offline)
    assert TOKEN not in str(err.value)


@pytest.mark.parametrize(
    ("repo", "token", "message"),
    [
        ("alice/traces", "", "^token:"),
        ("no-slash", TOKEN, "^repo_id: give it as owner/name in ASCII"),
        ("../etc/passwd", TOKEN, "^repo_id:"),
        ("alıce/tr", TOKEN, "^repo_id:"),  # a dotless i: Unicode `\w`, which the Hub refuses
        ("alice/trаces", TOKEN, "^repo_id:"),  # a Cyrillic a
    ],
)
def test_bad_input(trace, repo, token, message):
    with pytest.raises(ShareError, match=message):
        share_trace(trace, repo, token, api_factory=FakeApi)


NAMES = [
    *("alice/traces", "a/b", "Alice_1/attention-traces.v2", "_x/y_", "a" * 96 + "/" + "b" * 96),
    *("alıce/tr", "alice/trаces", "ａlice/traces", "alice/tr\u00e9", "alice", "a/b/c", "-a/b", "a./b", "a/b-"),
    *("a--b/c", "a/b..c", "a/b.git", "a" * 97 + "/b", "a/" + "b" * 97, "a/ b", "a/b\n", "/b", "a/"),
]


def hub_accepts(repo_id: str) -> bool:
    """The Hub's rule by another route: huggingface_hub's validator, plus the ASCII its regex's `\\w` misses."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        return False
    return repo_id.isascii() and repo_id.count("/") == 1


@pytest.mark.parametrize("repo", NAMES)
def test_repo_id_follows_the_hubs_rule_in_ascii(trace, repo):
    assert valid_repo_id(repo) == hub_accepts(repo)
    if not hub_accepts(repo.strip()):  # share_trace strips blanks a pasted name brings along
        with pytest.raises(ShareError, match="^repo_id: give it as owner/name in ASCII") as err:
            share_trace(trace, repo + "x" * 10**6 if repo == "alice" else repo, TOKEN, api_factory=FakeApi)
        assert len(str(err.value)) < 200


def test_missing_trace(tmp_path):
    with pytest.raises(ShareError, match="^trace:"):
        share_trace(tmp_path / "nothing.json", "alice/traces", TOKEN, api_factory=FakeApi)
