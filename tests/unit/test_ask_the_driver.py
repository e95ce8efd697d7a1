"""A question to the driver's JVM is asked once more when py4j lost its connection, and only
then: an error the JVM raised, or a second loss, reaches the caller."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import pytest
from py4j.protocol import Py4JError, Py4JJavaError

from pipeline.io.spark_session import ask_the_driver


def answers(*outcomes: object) -> Callable[[], object]:
    """A question whose answers are ``outcomes`` in turn (an exception is raised)."""
    pending = list(outcomes)

    def read() -> object:
        outcome = pending.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return read


def lost() -> Py4JError:
    # What py4j raises when the connection broke before the JVM's answer came.
    return Py4JError("An error occurred while calling o769.isActive")


def test_a_lost_connection_is_asked_again() -> None:
    assert ask_the_driver(answers(lost(), True)) is True


def test_an_answer_is_asked_once() -> None:
    read = answers(False, True)
    assert ask_the_driver(read) is False
    assert read() is True  # the second answer was left for the next question


def test_a_second_loss_is_raised() -> None:
    with pytest.raises(Py4JError, match=r"o769\.isActive"):
        ask_the_driver(answers(lost(), lost(), True))


def test_an_error_the_jvm_raised_is_not_asked_again() -> None:
    thrown = SimpleNamespace(_target_id="o2")  # the JVM's exception object, by reference
    raised = Py4JJavaError("An error occurred while calling o1.exception", thrown)
    with pytest.raises(Py4JJavaError):
        ask_the_driver(answers(raised, True))
