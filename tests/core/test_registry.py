import pytest

from scarcelab.errors import ConfigError
from scarcelab.methods import METHODS, get_method
from scarcelab.models import create_model, list_models
from scarcelab.registry import Registry


def test_register_and_lookup_case_insensitive():
    r: Registry = Registry("widget")

    @r.register("Foo")
    class Foo:
        pass

    assert r.get("foo") is Foo and r.get("FOO") is Foo
    assert r.names() == ["foo"] and "foo" in r
    assert Foo.registered_name == "foo"


def test_unknown_name_lists_valid_names():
    with pytest.raises(ConfigError, match=r"unknown method 'nope'; valid names: .*fixmatch.*sup"):
        get_method("nope")
    with pytest.raises(ConfigError, match=r"unknown arch 'vgg'.*resnet18.*small_cnn.*wrn28_2"):
        create_model("vgg")


def test_duplicate_registration_rejected():
    r: Registry = Registry("widget")
    r.register("a")(object())
    with pytest.raises(ConfigError, match="registered twice"):
        r.register("a")(object())


def test_builtin_entries_found_without_central_list():
    assert {"sup", "fixmatch", "simclr"} <= set(METHODS.names())
    assert {"resnet18", "wrn28_2", "small_cnn"} <= set(list_models())
    assert get_method("fixmatch").family == "semi"
    assert get_method("simclr").family == "self"
    assert get_method("sup").family == "supervised"


def test_al_datasets_live_on_the_shared_registry():
    """The fixed AL sets use the shared Registry (its lookup, listing and double-registration
    guard), and a loader registered from outside the module is listed and looked up like the
    built-in ones."""
    from scarcelab.active import datasets as ds

    assert isinstance(ds.AL_DATASETS, Registry)
    assert {"splice", "honeypot", "mnist_5k"} <= set(ds.AL_DATASETS.names())
    assert ds.spec("SPLICE") is ds.AL_DATASETS.get("splice")
    with pytest.raises(ConfigError, match="registered twice"):
        ds.register_al_dataset("honeypot", ds.dataset_config("splice"))(lambda d, r, c: None)

    def toy(data_dir, rng, ctx):  # type: ignore[no-untyped-def]
        raise AssertionError("not loaded here")

    name = "toy_registered_from_a_test"
    try:
        assert ds.register_al_dataset(name, ds.dataset_config("splice"), kind="text")(toy) is toy
        assert name in ds.list_al_datasets()
        assert ds.spec(name).loader is toy and ds.spec(name).kind == "text"
    finally:
        ds.AL_DATASETS._entries.pop(name, None)
