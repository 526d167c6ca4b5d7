"""Ray's serializers for a library are registered when the library is imported (lazy_serializers.py).

Ray's own serializers at work after such an import, in the driver and a worker of the embedded Ray, are
checked in tests/core/test_embedded_ray.py; here made-up packages show how the import hook behaves.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest

from trainlib._internal.startup import lazy_serializers


@pytest.fixture
def made_up_package(tmp_path, monkeypatch):
    """A package ``madeup`` with a submodule ``madeup.fields``, importable from ``tmp_path``; gone after."""
    root = tmp_path / "madeup"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "fields.py").write_text("class Field:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setattr(lazy_serializers, "_waiting", {})
    yield root
    for name in ("madeup", "madeup.fields"):
        sys.modules.pop(name, None)


def _hook_for(module: str, seen: list) -> None:
    """Registers, for ``module``, a registration that records each context with what it saw of the module."""

    def register(context):
        seen.append((context, getattr(sys.modules["madeup"], "fields", None) is sys.modules.get(module)))

    sys.meta_path.insert(0, lazy_serializers._AfterImport({module: register}))


def test_a_lookup_is_not_an_import_the_import_registers_each_waiting_context_once(made_up_package):
    seen: list = []
    _hook_for("madeup.fields", seen)
    lazy_serializers._waiting["madeup.fields"] = ["context 1", "context 2"]
    # Looking the module up (as Ray's start does for the dashboard's dependencies) registers nothing.
    assert importlib.util.find_spec("madeup.fields") is not None
    assert seen == [] and "madeup.fields" not in sys.modules
    importlib.import_module("madeup.fields")
    # Both contexts, once each, after the module ran; and the registration found it as madeup.fields.
    assert seen == [("context 1", True), ("context 2", True)]
    assert lazy_serializers._waiting == {}
    importlib.reload(sys.modules["madeup.fields"])
    assert len(seen) == 2


def test_a_failed_import_registers_nothing_and_the_next_import_registers(made_up_package):
    seen: list = []
    _hook_for("madeup.fields", seen)
    lazy_serializers._waiting["madeup.fields"] = ["context"]
    (made_up_package / "fields.py").write_text("raise RuntimeError('half installed')\n")
    with pytest.raises(RuntimeError, match="half installed"):
        importlib.import_module("madeup.fields")
    assert seen == [] and lazy_serializers._waiting == {"madeup.fields": ["context"]}
    (made_up_package / "fields.py").write_text("class Field:\n    pass\n")
    importlib.invalidate_caches()
    sys.modules.pop("madeup.fields", None)
    importlib.import_module("madeup.fields")
    assert seen == [("context", True)]


def test_a_ray_whose_apply_does_more_is_left_alone(monkeypatch):
    from ray.util import serialization_addons

    def apply_with_a_new_addon(context):
        serialization_addons.register_something_new(context)

    monkeypatch.setattr(serialization_addons, "apply", apply_with_a_new_addon)
    monkeypatch.setattr(lazy_serializers, "_installed", False)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    assert lazy_serializers.defer_serialization_addons() is False
    assert serialization_addons.apply is apply_with_a_new_addon


def test_a_context_created_after_a_library_is_imported_gets_its_serializer_at_once(monkeypatch):
    from ray.util import serialization_addons

    monkeypatch.setattr(serialization_addons, "apply", serialization_addons.apply)  # restored after the test
    monkeypatch.setattr(lazy_serializers, "_installed", False)
    monkeypatch.setattr(lazy_serializers, "_waiting", {})
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    registered = []
    monkeypatch.setattr(
        lazy_serializers,
        "_registrations",
        lambda: {
            "json": lambda context: registered.append(("json", context)),
            "madeup_never_installed": lambda context: registered.append(("never", context)),
        },
    )
    assert lazy_serializers.defer_serialization_addons() is True
    serialization_addons.apply("context")
    assert registered == [("json", "context")]  # json is imported: registered at once
    assert lazy_serializers._waiting == {"madeup_never_installed": ["context"]}


def test_rays_pydantic_compat_importing_pydantic_first_still_sees_it():
    """In a worker of the embedded Ray, Ray's pydantic_compat is often the first to import pydantic (Ray Data's
    SplitCoordinator does, through ray.util.state). It must still find pydantic, and a v1 ModelField, once its
    module is imported, gets Ray's serializer."""
    import subprocess

    code = """if True:
        import sys
        from trainlib._internal.startup.lazy_serializers import defer_serialization_addons
        assert "pydantic" not in sys.modules
        assert defer_serialization_addons()
        from ray.util import serialization_addons
        registered = []
        class Context:
            def _register_cloudpickle_serializer(self, cls, **kwargs):
                registered.append(cls.__module__ + "." + cls.__name__)
        serialization_addons.apply(Context())
        import ray._common.pydantic_compat as compat
        import ray.util.state.common  # builds pydantic dataclasses with init=not IS_PYDANTIC_2
        assert compat.IS_PYDANTIC_2, "pydantic_compat saw no pydantic"
        assert registered == [], registered  # no v1 ModelField can exist yet
        import pydantic.v1.fields
        assert registered == ["pydantic.v1.fields.ModelField"], registered
        print("OK")
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr[-3000:]
