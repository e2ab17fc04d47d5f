"""The webhook's serving certificate when neither cert-manager nor an existing Secret
provides one: a private CA and a certificate it signs for the webhook Service's names.

Made at run time by the operator (never at chart render time, so `helm template`, Argo CD
and Flux render the same manifests every time). Plain functions: the time is passed in.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

RENEW_BEFORE = datetime.timedelta(days=30)
"""A certificate this close to its end is replaced."""


@dataclass(frozen=True)
class ServingCertificate:
    """PEM texts: the CA (what the API server trusts), the certificate and its key."""

    ca: bytes
    cert: bytes
    key: bytes


def make_serving_certificate(
    names: Sequence[str], now: datetime.datetime, *, days: int = 3650
) -> ServingCertificate:
    """A fresh CA and a certificate for `names` (the first is the common name)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    until = now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{names[0]}-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(until)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return ServingCertificate(
        ca=ca.public_bytes(pem),
        cert=cert.public_bytes(pem),
        key=key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )


def needs_renewal(cert_pem: bytes, names: Sequence[str], now: datetime.datetime) -> bool:
    """Whether `cert_pem` is unreadable, misses one of `names`, or ends within
    `RENEW_BEFORE` of `now`."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except (ValueError, x509.ExtensionNotFound):
        return True
    covered = set(sans.value.get_values_for_type(x509.DNSName))
    return not set(names) <= covered or cert.not_valid_after_utc - RENEW_BEFORE <= now
