"""Certificates and keys for a loopback control plane (ECDSA P-256, fast to make)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
KUBERNETES_SERVICE_IP = "10.0.0.1"


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    ca_key: Path
    apiserver_cert: Path
    apiserver_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path  # service-account token signing key
    sa_pub: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _builder(subject: x509.Name, issuer: x509.Name, pub: ec.EllipticCurvePublicKey,
             days: int) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(pub)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
    )


def issue_serving_cert(pki: Pki, directory: Path, name: str,
                       hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> tuple[Path, Path]:
    """A serving certificate signed by the testbed CA, e.g. for a local webhook."""
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    key = _key()
    sans: list[x509.GeneralName] = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    cert = (
        _builder(_name(hosts[0]), ca.subject, key.public_key(), 30)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    crt, pem_key = directory / f"{name}.crt", directory / f"{name}.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(pem_key, key)
    return crt, pem_key


def make_pki(directory: Path, extra_ips: tuple[str, ...] = ()) -> Pki:
    """Write a CA, an API-server serving cert, an admin client cert and SA keys.
    ``extra_ips``: more addresses the API server is reached at (the real node's side)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = _name("grpo-testbed-ca")
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key(), 30)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                          content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False,
                          encipher_only=False, decipher_only=False),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(cn: str, org: str | None, server: bool) -> tuple[x509.Certificate,
                                                              ec.EllipticCurvePrivateKey]:
        key = _key()
        b = _builder(_name(cn, org), ca_name, key.public_key(), 30)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        b = b.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if server:
            dns = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                   "kubernetes.default.svc.cluster.local"]
            ips = [ipaddress.ip_address(a)
                   for a in ("127.0.0.1", KUBERNETES_SERVICE_IP, *extra_ips)]
            b = b.add_extension(
                x509.SubjectAlternativeName(
                    [*(x509.DNSName(d) for d in dns), *(x509.IPAddress(i) for i in ips)]
                ),
                critical=False,
            )
        return b.sign(ca_key, hashes.SHA256()), key

    server_cert, server_key = leaf("kube-apiserver", None, server=True)
    # system:masters is the cluster-admin group; the control-plane components and
    # the tests' kubectl use it. The operator under test uses its own SA tokens.
    admin_cert, admin_key = leaf("testbed-admin", "system:masters", server=False)
    sa_key = _key()

    pki = Pki(
        ca_cert=directory / "ca.crt", ca_key=directory / "ca.key",
        apiserver_cert=directory / "apiserver.crt", apiserver_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt", admin_key=directory / "admin.key",
        sa_key=directory / "sa.key", sa_pub=directory / "sa.pub",
    )
    pem = serialization.Encoding.PEM
    pki.ca_cert.write_bytes(ca.public_bytes(pem))
    _write_key(pki.ca_key, ca_key)
    pki.apiserver_cert.write_bytes(server_cert.public_bytes(pem))
    _write_key(pki.apiserver_key, server_key)
    pki.admin_cert.write_bytes(admin_cert.public_bytes(pem))
    _write_key(pki.admin_key, admin_key)
    _write_key(pki.sa_key, sa_key)
    pki.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return pki
