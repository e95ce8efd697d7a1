"""A Lua script run again while Redis answers NOSCRIPT (a restarted Redis forgets its scripts,
and one restarted between redis-py's own reload and the run forgets it again)."""

from __future__ import annotations

from typing import Any

import pytest
from redis.connection import Encoder
from redis.exceptions import NoScriptError

from pipeline.io import redis_client


class ForgetfulRedis:
    """Answers NOSCRIPT to the first ``forgets`` EVALSHA calls, whatever was loaded."""

    def __init__(self, forgets: int) -> None:
        self.forgets, self.loads, self.runs = forgets, 0, 0

    def get_encoder(self) -> Encoder:
        return Encoder("utf-8", "strict", decode_responses=False)

    def script_load(self, _text: str) -> str:
        self.loads += 1
        return "sha"

    def evalsha(self, _sha: str, _numkeys: int, *_args: Any) -> str:
        self.runs += 1
        if self.runs <= self.forgets:
            raise NoScriptError("No matching script. Please use EVAL.")
        return "applied"


def test_a_script_forgotten_twice_is_loaded_and_run_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redis_client.time, "sleep", lambda _seconds: None)
    redis = ForgetfulRedis(forgets=3)
    script = redis_client.register_script(redis, "return 1")  # type: ignore[arg-type]
    assert script(keys=["k"], args=[1]) == "applied"
    assert redis.loads >= 1 and redis.runs == 4


def test_a_script_redis_never_keeps_fails_after_the_attempts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(redis_client.time, "sleep", lambda _seconds: None)
    redis = ForgetfulRedis(forgets=1_000)
    script = redis_client.register_script(redis, "return 1")  # type: ignore[arg-type]
    with pytest.raises(NoScriptError):
        script(keys=["k"], args=[1])
    assert redis.runs == 2 * redis_client.SCRIPT_ATTEMPTS  # redis-py's own reload, each time
