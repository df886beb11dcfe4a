"""The vocabulary every settings section is written in: the Section base class and the rules
of a field (``check(predicate, "what is valid")``, ``one_of(...)``, ``positive``, the aliases
below), with the texts the one-line messages and the settings reference quote.

A field is declared as ``name: type = Field(default, description="what it means")``, with its
rule as ``Annotated[type, rule]``; the description is the settings reference (docs/settings.md).
"""

from __future__ import annotations

import ipaddress
import re
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict
from pydantic_core import PydanticCustomError

PROJECT_ROOT = Path(__file__).resolve().parents[2]

DRIVER_VERSION_RE = re.compile(r"^\d{3}\.\d{2,3}(\.\d{2,3})?$")
PCI_ADDRESS_RE = re.compile(r"^(?:[a-f0-9]{4,}:)?[a-f0-9]{2}:[a-f0-9]{2}\.[a-f0-9]$")
UNIX_NAME_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
SECRET_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DNS_NAME_RE = re.compile(r"^[a-zA-Z0-9]([a-zA-Z0-9-]{0,62})(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,62}))*$")


# ----------------------------------------------------------------------------------------------
# Rules of a field: an AfterValidator (it runs once the strict type check passed) whose error
# carries "what would be valid" for the one-line message.


_RULE_TEXT: dict[int, str] = {}  # id of a check()'s validator (module-level, never freed) -> its text


def check(predicate: Callable[[Any], Any], valid: str) -> AfterValidator:
    def run(value):
        if not predicate(value):
            raise PydanticCustomError("inference_host", "{valid}", {"valid": valid})
        return value

    validator = AfterValidator(run)
    _RULE_TEXT[id(validator)] = valid  # what a wrong type's message names too (rule_text)
    return validator


def one_of(*choices) -> AfterValidator:
    return check(lambda v: v in choices, "one of " + ", ".join(repr(c) for c in choices))


def is_cidr(value: str) -> bool:
    try:
        return "/" in value and bool(ipaddress.ip_interface(value))
    except ValueError:
        return False


def is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


positive = check(lambda v: v > 0, "a number greater than 0")
tcp_port = check(lambda v: 1 <= v <= 65535, "1 to 65535")
AbsolutePath = Annotated[str, check(lambda v: v.startswith("/") and ".." not in v.split("/"),
                                    "an absolute path")]
UnixName = Annotated[str, check(UNIX_NAME_RE.match,
                                "a lower-case Unix user/group name ([a-z_][a-z0-9_-]*)")]
SecretName = Annotated[str, check(SECRET_NAME_RE.match, "a key of the secrets vault (letters, digits, _)")]
def pci_address(address: str) -> str:
    """The one spelling of a PCI address: with its domain (01:00.0 is 0000:01:00.0, as lspci -D,
    sysfs, /proc/driver/nvidia/gpus and Proxmox's hostpci write it), so that two spellings of
    one GPU are one GPU in every comparison."""
    return address if address.count(":") == 2 else f"0000:{address}"


def _pci_addresses(value: list[str]) -> list[str]:
    if not all(PCI_ADDRESS_RE.match(a) for a in value):
        raise PydanticCustomError("inference_host", "{valid}", {
            "valid": "PCI addresses like 0000:01:00.0 (lower-case hex, domain optional)"})
    addresses = [pci_address(a) for a in value]
    repeated = sorted({a for a in addresses if addresses.count(a) > 1})
    if repeated:
        listed = ", ".join(f"{a} {addresses.count(a)} times" for a in repeated)
        raise PydanticCustomError("inference_host", "{valid}", {
            "valid": f"each GPU once (01:00.0 and 0000:01:00.0 are one GPU); listed: {listed}"})
    return addresses



PciAddresses = Annotated[list[str], AfterValidator(_pci_addresses)]
DriverVersion = Annotated[str, check(DRIVER_VERSION_RE.match, "a full driver version like 580.95.05")]
Url = Annotated[str, check(lambda v: re.match(r"^https?://[^\s/]+(/\S*)?$", v) is not None,
                           "an http(s) URL without trailing spaces")]
IpAddress = Annotated[str, check(is_ip, "an IP address to bind (127.0.0.1, 0.0.0.0, ...)")]


class Section(BaseModel):
    """Host-data keys sharing a prefix. Field name = key without the prefix."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
    PREFIX: ClassVar[str]


def type_text(annotation: Any) -> str:
    """A field's type as the settings reference and the messages write it: int | None, list[str]."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return type_text(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_text(a) for a in args)
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(type_text(a) for a in args)}]"
    if annotation is Any:
        return "Any"
    return "None" if annotation is type(None) else annotation.__name__


def expected_type(annotation: Any) -> str:
    words = {"int": "an integer", "str": "a string", "bool": "True or False",
             "float": "a number", "None": "None"}
    text = " or ".join(words.get(part, part) for part in type_text(annotation).split(" | "))
    rule = rule_text(annotation)
    return f"{text} ({rule})" if rule else text


def rule_text(annotation: Any) -> str | None:
    """The `check` rule's text inside a field's type (Annotated[int, tcp_port] | None: 1 to 65535)."""
    if typing.get_origin(annotation) is Annotated:
        return next((_RULE_TEXT[id(m)] for m in annotation.__metadata__ if id(m) in _RULE_TEXT), None)
    return next((rule for arg in typing.get_args(annotation) if (rule := rule_text(arg))), None)

