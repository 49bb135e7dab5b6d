"""Differential fuzzing: `gpuwarden.x509lite` against `cryptography` on generated subjects (issue 44).

The property the adapter's authentication rests on: for any certificate, the two readers give the same
subject reading (every CN and every O, in order) or one of them refuses it - never a different identity.
And the identity rule on top: a subject with other than exactly one CN names no user. Subjects are
generated (several RDNs, multi-valued ones, CNs and Os among other attributes, every string type the
readers meet, any text) and then mutated byte by byte inside the subject, so both well-formed and broken
DER reach the readers. Derandomized, as tests/integration/test_promql_properties.py: the same cases every
run; the budget (examples per test) is set so each test takes a few seconds.
"""

from __future__ import annotations

from typing import Any

import pytest
from cryptography import x509
from cryptography.x509.name import _ASN1Type
from cryptography.x509.oid import NameOID
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapter import auth, certjudge
from gpuwarden import x509lite
from harness.testbed.pki import make_ca
from tests.unit.x509_support import cert_with_subject

pytestmark = pytest.mark.filterwarnings("ignore:Attribute's length:UserWarning")

CA = make_ca("fuzz-ca")
SETTINGS: dict[str, Any] = {
    "deadline": None,
    "database": None,
    "derandomize": True,
    "suppress_health_check": list(HealthCheck),
}
GENERATED_EXAMPLES = 600
MUTATED_EXAMPLES = 600

OIDS = [
    NameOID.COMMON_NAME,
    NameOID.ORGANIZATION_NAME,
    NameOID.ORGANIZATIONAL_UNIT_NAME,
    NameOID.LOCALITY_NAME,
]
TYPES = [
    _ASN1Type.UTF8String,
    _ASN1Type.PrintableString,
    _ASN1Type.IA5String,
    _ASN1Type.T61String,
    _ASN1Type.BMPString,
    _ASN1Type.UniversalString,
    _ASN1Type.VisibleString,  # a string type x509lite does not read: it must refuse, not misread
]
TEXT = st.text(
    st.one_of(st.sampled_from("abc-:. =,+\\\"'@*"), st.characters(codec="utf-8")), min_size=0, max_size=12
)
ATTRIBUTE = st.builds(
    lambda oid, value, kind: x509.NameAttribute(oid, value, _type=kind, _validate=False),
    st.sampled_from(OIDS),
    TEXT,
    st.sampled_from(TYPES),
)
NAME = st.lists(
    st.lists(ATTRIBUTE, min_size=1, max_size=3, unique_by=lambda a: (a.oid, a.value)), max_size=5
).map(lambda rdns: x509.Name([x509.RelativeDistinguishedName(rdn) for rdn in rdns]))


def readings(der: bytes) -> tuple[Any, Any]:
    """(x509lite's (CNs, Os) or None if it refuses, cryptography's the same way)."""
    try:
        lite = x509lite.parse(der)
        ours: Any = (lite.common_names, lite.organizations)
    except ValueError:
        ours = None
    try:
        cns, orgs = certjudge.subject(der)
        theirs: Any = (tuple(cns), tuple(orgs))
    except Exception:
        theirs = None
    return ours, theirs


def check(der: bytes) -> None:
    ours, theirs = readings(der)
    if ours is not None and theirs is not None:
        assert ours == theirs, "x509lite and cryptography read different subjects"
        # Kubernetes' user: chain[0].Subject.CommonName, which Go's pkix sets to the last CN attribute
        assert x509lite.parse(der).common_name == (theirs[0][-1] if theirs[0] else "")
    if ours is not None:
        lite = x509lite.parse(der)
        user = auth.cert_user(lite)
        if len(lite.common_names) != 1:
            assert user is None, "a subject with other than exactly one CN named a user"
        elif lite.common_names[0]:
            assert user is not None and user.name == lite.common_name == lite.common_names[-1]


def encoded(name: x509.Name) -> bytes | None:
    try:
        return cert_with_subject(CA, name)
    except ValueError:  # cryptography will not encode it (e.g. a character its BMPString cannot hold)
        return None


@settings(max_examples=GENERATED_EXAMPLES, **SETTINGS)
@given(NAME)
def test_generated_subjects_read_alike_or_refused(name: x509.Name) -> None:
    der = encoded(name)
    if der is not None:
        check(der)


@settings(max_examples=MUTATED_EXAMPLES, **SETTINGS)
@given(NAME, st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4))
def test_mutated_subjects_read_alike_or_refused(name: x509.Name, edits: list[tuple[int, int]]) -> None:
    der = encoded(name)
    if der is None:
        return
    subject = x509.load_der_x509_certificate(der).subject.public_bytes()
    at = der.index(subject)
    mutated = bytearray(der)
    for offset, value in edits:
        mutated[at + offset % len(subject)] = value
    check(bytes(mutated))
