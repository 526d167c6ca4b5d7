"""The training function bound once on the driver: the config decision, the pickling, the loading."""

from __future__ import annotations

import threading

import pytest

from trainlib._internal.execution.train_fn import TrainFunction


def no_args():
    return "ran"


def takes_config(config):
    return dict(config)


def test_a_function_that_takes_the_config_gets_an_empty_dict_when_none_was_given():
    assert TrainFunction.bind(takes_config, None).load()() == {}
    assert TrainFunction.bind(takes_config, {"lr": 0.1}).load()() == {"lr": 0.1}
    assert TrainFunction.bind(no_args, None).load()() == "ran"


def test_unpack_gives_back_what_the_user_passed():
    func, config = TrainFunction.bind(takes_config, None).unpack()
    assert func(config or {"a": 1}) == {"a": 1} and config is None
    assert TrainFunction.bind(takes_config, {"lr": 0.1}).unpack()[1] == {"lr": 0.1}


def test_config_for_a_function_without_arguments_is_refused():
    with pytest.raises(TypeError, match="takes no arguments"):
        TrainFunction.bind(no_args, {"lr": 0.1})


def test_the_unpicklable_config_entry_is_named():
    with pytest.raises(TypeError, match=r"train_loop_config\['lock'\] \(lock\) cannot be serialised"):
        TrainFunction.bind(takes_config, {"lr": 0.1, "lock": threading.Lock()})


def test_an_unpicklable_function_is_named():
    lock = threading.Lock()

    def uses_lock():
        with lock:
            pass

    with pytest.raises(TypeError, match="train_loop_per_worker cannot be serialised"):
        TrainFunction.bind(uses_lock, None)
