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
