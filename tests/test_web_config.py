"""The web config key by key against exporter-toolkit's (web/tls_config.go, docs/web-configuration.md).

Every key a Go exporter's web config may hold is either honoured or refused with a message that
names it and says why; what is accepted but cannot be applied loads with a warning.  The files
here are written as exporter-toolkit's own test data writes them (web/testdata/*.good.yml), with
real certificates; what the TLS keys do on a connection is in test_web_tls.py.
"""

from __future__ import annotations

import os
import ssl
import textwrap
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml

from gpu_exporter.web.config import WebConfig, WebConfigError, load_web_config
from gpu_exporter.web.rate_limit import RateLimit
from tests import assert_mentions
from tests.exporter_helpers import run_daemon, wait_for
from tests.fakenvml import Scenario
from tests.fakenvml.presets import preset
from tests.web_helpers import basic, client_context, fixed_hash, get, tls_files

pytestmark = pytest.mark.integration

HASH = fixed_hash("pw")


@pytest.fixture
def certs(tmp_path: Path, ca: trustme.CA) -> Path:
    """server.crt, server.key and client_ca.pem beside the web config, as exporter-toolkit's tests have them."""
    tls_files(tmp_path, ca, "server")
    (tmp_path / "client_ca.pem").write_bytes(ca.cert_pem.bytes())
    return tmp_path


def load(directory: Path, text: str) -> WebConfig:
    path = directory / "web.yml"
    path.write_text(textwrap.dedent(text))
    return load_web_config(path)


def refused(directory: Path, text: str, *needles: str) -> str:
    with pytest.raises(WebConfigError) as e:
        load(directory, text)
    message = str(e.value)
    assert str(directory / "web.yml") in message
    for needle in needles:
        assert needle in message, (needle, message)
    return message


# -- a node_exporter web config with every key --------------------------------------------------------------
EVERY_KEY = f"""
    tls_server_config:
      cert_file: server.crt
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: client_ca.pem
      client_allowed_sans: [prometheus.example, 10.0.0.1]
      min_version: TLS12
      max_version: TLS13
      cipher_suites:
        - TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
        - TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
        - TLS_AES_128_GCM_SHA256
      prefer_server_cipher_suites: true
      curve_preferences: [X25519]
    http_server_config:
      http2: true
      headers:
        X-Frame-Options: deny
        X-Content-Type-Options: nosniff
        Strict-Transport-Security: max-age=31536000; includeSubDomains
        X-XSS-Protection: "1"
        Content-Security-Policy: "default-src 'self'"
    basic_auth_users:
      prometheus: {HASH}
    rate_limit:
      interval: 100ms
      burst: 20
"""


def test_a_node_exporter_web_config_with_every_key_loads(certs: Path) -> None:
    config = load(certs, EVERY_KEY)
    assert config.tls is not None and config.tls.allowed_sans == frozenset({"prometheus.example", "10.0.0.1"})
    ctx = config.tls.context
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert ctx.maximum_version == ssl.TLSVersion.TLSv1_3 and ctx.options & ssl.OP_CIPHER_SERVER_PREFERENCE
    tls12 = [c["name"] for c in ctx.get_ciphers() if c["protocol"] == "TLSv1.2"]
    assert tls12 == ["ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-ECDSA-AES128-GCM-SHA256"]  # in the order given
    assert dict(config.headers)["X-Frame-Options"] == "deny" and len(config.headers) == 5
    assert set(config.users) == {"prometheus"} and config.rate_limit == RateLimit(0.1, 20)
    assert config.files == (certs / "web.yml", certs / "server.crt", certs / "server.key", certs / "client_ca.pem")
    # http2 is the one key accepted and not applied, and it says so.
    assert len(config.warnings) == 1
    assert_mentions(config.warnings[0], "http_server_config.http2", "HTTP/2 is not served")


def test_a_shared_web_config_starts_the_daemon_and_its_warnings_are_logged_once(
    certs: Path, ca: trustme.CA, scenario: Scenario
) -> None:
    preset("pcie-degraded", scenario.path).write()
    web = certs / "web.yml"
    web.write_text(yaml.safe_dump({
        "tls_server_config": {"cert_file": "server.crt", "key_file": "server.key", "min_version": "TLS10",
                              "curve_preferences": ["CurveP256", "CurveP384", "CurveP521", "X25519"]},
        "http_server_config": {"http2": True}, "basic_auth_users": {"prom": HASH},
        "rate_limit": {"interval": "10ms", "burst": 50}}))  # fmt: skip
    with run_daemon(scenario.path, "--web.config.file", str(web), "--poll.interval", "200ms") as d:
        ctx = client_context(ca)
        wait_for(lambda: get(d.port, headers=basic("prom", "pw"), context=ctx)[0] == 200, what="a scrape")
        for _ in range(3):  # the config is read again on connections: warnings stay once per load
            assert get(d.port, "/healthz", context=ctx)[0] == 200
    warnings = [line["warning"] for line in d.log if line.get("event") == "web_config_not_applied"]
    assert len(warnings) == 3, warnings
    for words in ("http2", "min_version TLS10 is raised to TLS12", "curve_preferences lists 4 curves"):
        assert sum(words in str(w) for w in warnings) == 1, (words, warnings)


# -- exporter-toolkit's own good files ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "text",
    [
        # tls_config_noAuth.requireandverifyclientcert.good.yml
        "tls_server_config: {cert_file: server.crt, key_file: server.key, "
        "client_auth_type: RequireAndVerifyClientCert, client_ca_file: client_ca.pem}",
        # web_config_noAuth.good.yml
        "tls_server_config: {cert_file: server.crt, key_file: server.key, client_auth_type: VerifyClientCertIfGiven, "
        "client_ca_file: client_ca.pem}",
        # web_config_noAuth_allCiphers.good.yml (all of Go's secure suites)
        "tls_server_config: {cert_file: server.crt, key_file: server.key, cipher_suites: ["
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, "
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384, "
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256, "
        "TLS_AES_128_GCM_SHA256, TLS_AES_256_GCM_SHA384, TLS_CHACHA20_POLY1305_SHA256, "
        "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA, "
        "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA, TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA]}",
        # web_config_noAuth_noHTTP2.good.yml
        "tls_server_config: {cert_file: server.crt, key_file: server.key, cipher_suites: "
        "[TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384], max_version: TLS12}\nhttp_server_config: {http2: false}",
        # web_config_noAuth_someCiphers_noOrder.good.yml
        "tls_server_config: {cert_file: server.crt, key_file: server.key, cipher_suites: "
        "[TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384, TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256], "
        "prefer_server_cipher_suites: false, min_version: TLS12, max_version: TLS12}",
        # web_config_noAuth_someCurves.good.yml
        "tls_server_config: {cert_file: server.crt, key_file: server.key, min_version: TLS13, "
        "curve_preferences: [CurveP521]}",
        # web_config_headers.good.yml
        "http_server_config: {headers: {X-Frame-Options: deny, X-Content-Type-Options: nosniff, "
        "X-XSS-Protection: '1', Strict-Transport-Security: max-age=31536000; includeSubDomains}}",
        # web_config_rate_limiter_nonblocking.yaml: interval 0 is off
        "rate_limit: {interval: 0, burst: 0}",
        # web_config_empty.yml
        "",
        # web_config_users_noTLS.good.yml, with the costs this server accepts
        f"basic_auth_users: {{alice: '{HASH}', carol: '{HASH}'}}",
    ],
)
def test_exporter_toolkits_good_files_load_without_a_warning(certs: Path, text: str) -> None:
    config = load(certs, text)
    assert config.warnings == ()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("tls_server_config: {cert_file: server.crt, key_file: server.key, min_version: TLS11}",
         "min_version TLS11 is raised to TLS12"),
        ("tls_server_config: {cert_file: server.crt, key_file: server.key, cert: x}",
         "both cert and cert_file are given; cert_file is used"),
        ("tls_server_config: {min_version: TLS13, cipher_suites: [TLS_AES_128_GCM_SHA256]}",
         "names no certificate: served over plain HTTP"),
        ("tls_server_config: {cert_file: server.crt, key_file: server.key, cipher_suites: [TLS_AES_128_GCM_SHA256]}",
         "only TLS 1.3 is served"),
        ("tls_server_config: {cert_file: server.crt, key_file: server.key, "
         "cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_RSA_WITH_3DES_EDE_CBC_SHA]}",
         "TLS_RSA_WITH_3DES_EDE_CBC_SHA not available in OpenSSL"),
        ("http_server_config: {http2: true}", "http2: HTTP/2 is not served"),
    ],
)  # fmt: skip
def test_what_is_accepted_and_not_applied_loads_with_one_warning(certs: Path, text: str, words: str) -> None:
    config = load(certs, text)
    assert len(config.warnings) == 1 and words in config.warnings[0], config.warnings
    assert str(certs / "web.yml") in config.warnings[0]


def test_without_a_certificate_tls_server_config_is_plain_http_as_in_exporter_toolkit(certs: Path) -> None:
    assert load(certs, "tls_server_config: {min_version: TLS13}").tls is None


def test_tls_1_3_suites_alone_serve_only_tls_1_3(certs: Path) -> None:
    config = load(certs, "tls_server_config: {cert_file: server.crt, key_file: server.key, "
                         "cipher_suites: [TLS_AES_256_GCM_SHA384]}")  # fmt: skip
    assert config.tls is not None and config.tls.context.minimum_version == ssl.TLSVersion.TLSv1_3


def test_the_rsa_suites_go_listed_until_1_22_are_honoured(certs: Path) -> None:
    config = load(certs, "tls_server_config: {cert_file: server.crt, key_file: server.key, cipher_suites: "
                         "[TLS_RSA_WITH_AES_128_GCM_SHA256, TLS_RSA_WITH_AES_256_CBC_SHA]}")  # fmt: skip
    assert config.tls is not None and config.warnings == ()
    assert [c["name"] for c in config.tls.context.get_ciphers() if c["protocol"] != "TLSv1.3"] == [
        "AES128-GCM-SHA256", "AES256-SHA"]  # fmt: skip


# -- refused, with the key and the reason ----------------------------------------------------------------------
TLS = "tls_server_config: {cert_file: server.crt, key_file: server.key, "


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        (TLS + "client_auth_type: RequireAnyClientCert}", ["client_auth_type", "RequireAnyClientCert", "no CA signed"]),
        (TLS + "client_auth_type: RequireClientCert}", ["client_auth_type", "RequireClientCert", "no CA signed"]),
        (TLS + "client_auth_type: RequestClientCert}", ["client_auth_type", "RequestClientCert", "no CA signed"]),
        (TLS + "client_auth_type: x}", ["client_auth_type", "unknown client_auth_type 'x'"]),
        (TLS + "client_ca_file: client_ca.pem}", ["client CA is given", "exporter-toolkit refuses this too"]),
        (TLS + "client_ca: x}", ["client CA is given"]),
        (TLS + "client_auth_type: RequireAndVerifyClientCert}", ["needs client_ca_file or client_ca",
                                                                 "every public CA"]),
        (TLS + "client_allowed_sans: [a]}", ["client_allowed_sans needs a client_auth_type"]),
        (TLS + "client_auth_type: RequireAndVerifyClientCert, client_ca_file: client_ca.pem, client_allowed_sans: []}",
         ["client_allowed_sans is empty: every client would be refused"]),
        (TLS + "cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA2048]}",
         ["tls_server_config.cipher_suites", "unknown cipher suite 'TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA2048'"]),
        (TLS + "cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]}", ["unknown cipher suite 'TLS_RSA_WITH_RC4_128_SHA'"]),
        (TLS + "cipher_suites: [TLS_AES_128_GCM_SHA256], max_version: TLS12}",
         ["cipher_suites lists only TLS 1.3 suites", "max_version is TLS12"]),
        (TLS + "curve_preferences: [CurveP257]}", ["tls_server_config.curve_preferences", "unknown curve 'CurveP257'"]),
        (TLS + "min_version: TLS111}", ["tls_server_config.min_version", "unknown TLS version 'TLS111'"]),
        (TLS + "max_version: TLS11}", ["max_version TLS11 is below TLS 1.2"]),
        (TLS + "min_version: TLS13, max_version: TLS12}", ["max_version TLS12 is below min_version TLS13"]),
        (TLS + "cert_filse: x}", ["tls_server_config.cert_filse: unknown key"]),
        ("tls_server_config: {cert_file: '', key_file: server.key}", ["give cert_file (or cert, inline)"]),
        ("tls_server_config: {cert_file: server.crt, key: ''}", ["give key_file (or key, inline)"]),
        ("tls_server_config: {cert_file: somefile, key_file: server.key}", ["cannot load TLS certificate",
                                                                            "somefile", "No such file"]),
        (TLS + "client_auth_type: VerifyClientCertIfGiven, client_ca_file: somefile}",
         ["cannot load client CA file", "somefile"]),
        ("http_server_config: {headers: {X-Content-Type-Options: sniff}}",
         ["http_server_config.headers", "X-Content-Type-Options 'sniff' is not one of nosniff"]),
        ("http_server_config: {headers: {X-Frame-Options: foo}}",
         ["X-Frame-Options 'foo' is not one of deny, sameorigin"]),
        ("http_server_config: {headers: {Content-Type: foo}}", ["cannot be set"]),
        ("http_server_config: {http3: true}", ["http_server_config.http3: unknown key"]),
        ("http_server_config: {http2: maybe}", ["http_server_config.http2"]),
        ("rate_limit: {interval: 1s, burst: 0}", ["rate_limit.burst 0", "lets no request through"]),
        ("rate_limit: {interval: 1s, burst: -1}", ["rate_limit.burst"]),
        ("rate_limit: {interval: soon, burst: 1}", ["rate_limit.interval", "'soon' is not a Go duration"]),
        ("rate_limit: {interval: 5, burst: 1}", ["rate_limit.interval", "no unit", "nanoseconds"]),
        ("rate_limit: {interval: -1s, burst: 1}", ["rate_limit.interval", "cannot be negative"]),
        ("rate_limit: {interval: 1s, burst: 1, per_ip: true}", ["rate_limit.per_ip: unknown key"]),
        ("basic_auth_users: {john: doe}", ["basic_auth_users.john", "must be a bcrypt hash"]),
        ("tls_config: {}", ["tls_config: unknown key"]),
    ],
)  # fmt: skip
def test_refused_with_the_key_and_the_reason(certs: Path, text: str, needles: list[str]) -> None:
    refused(certs, text, *needles)


# -- inline material --------------------------------------------------------------------------------------------
def inline_tls(ca: trustme.CA, **extra: str) -> dict[str, Any]:
    leaf = ca.issue_cert("127.0.0.1")
    return {"cert": leaf.cert_chain_pems[0].bytes().decode(), "key": leaf.private_key_pem.bytes().decode(), **extra}


def test_an_inline_key_that_is_wrong_is_named_and_never_quoted(tmp_path: Path, ca: trustme.CA) -> None:
    tls = inline_tls(ca)
    secret = tls["key"].splitlines()[1]
    tls["key"] = tls["key"].replace(secret, secret[::-1])
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump({"tls_server_config": tls}))
    with pytest.raises(WebConfigError) as e:
        load_web_config(path)
    assert "the inline key (key)" in str(e.value) and secret not in str(e.value) and secret[::-1] not in str(e.value)
    assert "BEGIN" not in str(e.value)


def test_an_inline_key_of_the_wrong_type_is_not_quoted(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump({"tls_server_config": {"cert": "c", "key": ["s3cret-material"]}}))
    with pytest.raises(WebConfigError) as e:
        load_web_config(path)
    assert "tls_server_config.key" in str(e.value) and "s3cret" not in str(e.value)


def test_inline_cert_and_key_with_a_key_file_mixed_as_go_allows(tmp_path: Path, ca: trustme.CA) -> None:
    _, key = tls_files(tmp_path, ca)
    leaf_cert = (tmp_path / "server.crt").read_text()
    config = load(tmp_path, yaml.safe_dump({"tls_server_config": {"cert": leaf_cert, "key_file": key.name}}))
    assert config.tls is not None and config.files == (tmp_path / "web.yml", key)


def test_inline_material_without_memfd_goes_through_a_private_file_removed_at_once(
    tmp_path: Path, ca: trustme.CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[tuple[str, int]] = []
    real_open = os.open

    def watching_open(path: str, flags: int, mode: int = 0o777, **kw: Any) -> int:
        fd = real_open(path, flags, mode, **kw)
        if str(path).endswith("pem"):
            made.append((str(path), os.stat(fd).st_mode & 0o777))
        return fd

    monkeypatch.delattr(os, "memfd_create")
    monkeypatch.setattr(os, "open", watching_open)
    config = load(tmp_path, yaml.safe_dump({"tls_server_config": inline_tls(ca)}))
    assert config.tls is not None
    assert len(made) == 2 and all(mode == 0o600 for _, mode in made), made
    assert not any(os.path.exists(path) or os.path.exists(os.path.dirname(path)) for path, _ in made)


def test_inline_client_ca(tmp_path: Path, ca: trustme.CA) -> None:
    tls = inline_tls(ca, client_ca=ca.cert_pem.bytes().decode(), client_auth_type="VerifyClientCertIfGiven")
    config = load(tmp_path, yaml.safe_dump({"tls_server_config": tls}))
    assert config.tls is not None and config.tls.context.verify_mode == ssl.CERT_OPTIONAL
    assert config.tls.context.cert_store_stats()["x509_ca"] == 1
    tls["client_ca"] = "not a certificate"
    refused(tmp_path, yaml.safe_dump({"tls_server_config": tls}), "cannot load the inline client CA (client_ca)")


def test_client_ca_file_wins_over_client_ca_as_in_exporter_toolkit(certs: Path, ca: trustme.CA) -> None:
    config = load(certs, TLS + "client_auth_type: VerifyClientCertIfGiven, client_ca_file: client_ca.pem, "
                               "client_ca: 'not a certificate'}")  # fmt: skip
    assert config.tls is not None and config.tls.context.cert_store_stats()["x509_ca"] == 1
    assert_mentions(config.warnings[0], "client_ca and client_ca_file", "client_ca_file is used", "exporter-toolkit")


# -- each refusal names the key, the value and the fix (it is what the operator reads) --------------------------
def cost(c: int) -> str:
    return HASH[:4] + f"{c:02d}" + HASH[6:]


@pytest.mark.parametrize(
    ("c", "why"),
    [(3, "bcrypt cannot check it"), (32, "bcrypt cannot check it"), (99, "bcrypt cannot check it"),
     (17, "each check would take seconds"), (31, "each check would take seconds")],
)  # fmt: skip
def test_a_bcrypt_cost_outside_4_to_16_is_refused_saying_why(tmp_path: Path, c: int, why: str) -> None:
    message = refused(tmp_path, f"basic_auth_users: {{prom: '{cost(c)}'}}")
    assert_mentions(message, "basic_auth_users.prom", f"bcrypt cost {c}", "4..16", why, "use 10 to 12",
                    "htpasswd -nbB -C 10 user password")  # fmt: skip


@pytest.mark.parametrize("c", [4, 10, 16])
def test_bcrypt_costs_from_4_to_16_load(tmp_path: Path, c: int) -> None:
    assert set(load(tmp_path, f"basic_auth_users: {{prom: '{cost(c)}'}}").users) == {"prom"}


def test_what_is_not_a_bcrypt_hash_is_refused_in_one_sentence(tmp_path: Path) -> None:
    message = refused(tmp_path, "basic_auth_users: {john: doe}")
    assert message.count("basic_auth_users") == 1, message  # one sentence, on the one user
    assert_mentions(message, "basic_auth_users.john", "bcrypt hash", "$2b$", "53 characters", "60 in all")


@pytest.mark.parametrize(
    ("value", "problem"),
    [("a\x00b", ("control character '\\x00'", "end the header")),
     ("\x1f", ("control character '\\x1f'", "end the header")),
     ("a\x7f", ("control character '\\x7f'", "end the header")),
     ("a\rb", ("control character '\\r'", "end the header")),
     ("\u2603x", ("'\u2603'", "outside Latin-1"))],
)  # fmt: skip
def test_a_header_value_that_would_break_the_answer_is_refused(
    tmp_path: Path, value: str, problem: tuple[str, ...]
) -> None:
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump({"http_server_config": {"headers": {"X-XSS-Protection": value}}}))
    with pytest.raises(WebConfigError) as e:
        load_web_config(path)
    assert_mentions(str(e.value), str(path), "http_server_config.headers.X-XSS-Protection", *problem)


@pytest.mark.parametrize("value", ["1; mode=block", "a\tb", "caf\u00e9", "\x80\xff", " "])
def test_tabs_and_latin_1_are_a_header_value(tmp_path: Path, value: str) -> None:
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump({"http_server_config": {"headers": {"X-XSS-Protection": value}}}))
    assert dict(load_web_config(path).headers) == {"X-XSS-Protection": value}


def test_every_problem_is_named_in_one_message(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text("basic_auth_users: {john: doe}\nrate_limit: {burst: x}\nextra: 1\n")
    with pytest.raises(WebConfigError) as e:
        load_web_config(path)
    message = str(e.value)
    assert_mentions(message, str(path), "basic_auth_users.john", "bcrypt hash", "rate_limit.burst", "valid integer",
                    "extra", "unknown key")  # fmt: skip
    assert message.count(str(path)) == 1, message  # one message, not one per problem


def test_a_web_config_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_bytes(b"http_server_config: {headers: {X-XSS-Protection: caf\xe9}}\n")
    with pytest.raises(WebConfigError) as e:
        load_web_config(path)
    assert_mentions(str(e.value), str(path), "not UTF-8", "0xe9", "line 1", "save it as UTF-8")


def test_without_tls_and_rate_limit_there_are_none(tmp_path: Path) -> None:
    for text in ("", "basic_auth_users: {}", "rate_limit: {interval: 0s, burst: 5}", "rate_limit: {burst: 5}"):
        config = load(tmp_path, text)
        assert config.tls is None and config.rate_limit is None and config.warnings == (), text
    assert load_web_config(None) == WebConfig()


def test_a_burst_of_one_is_a_limit(tmp_path: Path) -> None:
    assert load(tmp_path, "rate_limit: {interval: 2s, burst: 1}").rate_limit == RateLimit(2.0, 1)


def test_the_http2_warning_says_what_is_served_instead(tmp_path: Path) -> None:
    config = load(tmp_path, "http_server_config: {http2: true}")
    assert len(config.warnings) == 1, config.warnings
    assert_mentions(config.warnings[0], str(tmp_path / "web.yml"), "http_server_config.http2", "HTTP/2 is not served",
                    "HTTP/1.1", "ALPN", "every Prometheus")  # fmt: skip
    assert load(tmp_path, "http_server_config: {http2: false}").warnings == ()


# -- tls_server_config, warning by warning -------------------------------------------------------------------------
def only_warning(config: WebConfig) -> str:
    assert len(config.warnings) == 1, config.warnings
    return config.warnings[0].split(": ", 1)[1]


def test_the_server_context_keeps_pythons_defaults_and_sets_the_cipher_order(certs: Path) -> None:
    default = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).options
    for prefer, expected in (("true", default | ssl.OP_CIPHER_SERVER_PREFERENCE),
                             ("false", default & ~ssl.OP_CIPHER_SERVER_PREFERENCE)):  # fmt: skip
        config = load(certs, TLS + f"prefer_server_cipher_suites: {prefer}}}")
        assert config.tls is not None and config.tls.context.options == expected
        assert config.tls.context.protocol == ssl.PROTOCOL_TLS_SERVER


def test_tls_1_3_suites_with_a_tls_1_3_minimum_need_no_warning(certs: Path) -> None:
    config = load(certs, TLS + "min_version: TLS13, cipher_suites: [TLS_AES_128_GCM_SHA256]}")
    assert config.warnings == () and config.tls is not None
    assert config.tls.context.minimum_version == ssl.TLSVersion.TLSv1_3


def test_the_tls_1_3_only_sentences(certs: Path) -> None:
    config = load(certs, TLS + "cipher_suites: [TLS_AES_128_GCM_SHA256]}")
    assert_mentions(only_warning(config), "tls_server_config.cipher_suites", "only TLS 1.3 suites",
                    "TLS 1.2 has no cipher", "only TLS 1.3 is served", "as in Go")  # fmt: skip
    message = refused(certs, TLS + "cipher_suites: [TLS_AES_128_GCM_SHA256], max_version: TLS12}")
    assert_mentions(message, "tls_server_config.cipher_suites", "only TLS 1.3 suites", "max_version is TLS12",
                    "no handshake could succeed")  # fmt: skip


def test_suites_this_openssl_lacks(certs: Path) -> None:
    suites = (
        "TLS_RSA_WITH_3DES_EDE_CBC_SHA, TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA"
    )
    config = load(certs, TLS + f"cipher_suites: [{suites}]}}")
    warning = only_warning(config)
    assert_mentions(warning, "tls_server_config.cipher_suites", "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
                    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA", "not available", ssl.OPENSSL_VERSION,
                    "the others are used")  # fmt: skip
    assert "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256" not in warning  # the one available is not named
    message = refused(
        certs, TLS + "cipher_suites: [TLS_RSA_WITH_3DES_EDE_CBC_SHA, TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA]}"
    )
    assert_mentions(message, "tls_server_config.cipher_suites", "none of", "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
                    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA", ssl.OPENSSL_VERSION)  # fmt: skip


def test_the_curves_sentence(certs: Path) -> None:
    config = load(certs, TLS + "curve_preferences: [X25519, CurveP256]}")
    assert_mentions(only_warning(config), "tls_server_config.curve_preferences", "2 curves", "one curve only",
                    "OpenSSL's default curves are kept", "every curve listed", "list one curve")  # fmt: skip


def test_unknown_names_are_listed_with_the_known_ones(certs: Path) -> None:
    message = refused(certs, TLS + "curve_preferences: [X25519, P-256, Curve25519]}")
    unknown, known = message.split("known: ")  # the fix: the names that are known, after those that are not
    assert_mentions(unknown, "tls_server_config.curve_preferences", "unknown curve", "'P-256'", "'Curve25519'")
    assert "X25519" not in unknown  # the one that is known is not called unknown
    assert known.split(", ") == ["CurveP256", "CurveP384", "CurveP521", "X25519"]


def test_the_key_and_the_certificate_are_named_by_file_or_as_inline(tmp_path: Path, ca: trustme.CA) -> None:
    crt, key = tls_files(tmp_path, ca)
    other_key = trustme.CA().issue_cert("x").private_key_pem.bytes().decode()
    message = refused(tmp_path, yaml.safe_dump({"tls_server_config": {"cert_file": str(crt), "key": other_key}}))
    assert_mentions(message, "cannot load", f"certificate {crt}", "the inline key (key)")
    message = refused(tmp_path, yaml.safe_dump({"tls_server_config": {"cert": "junk", "key_file": str(key)}}))
    assert_mentions(message, "cannot load", "the inline TLS certificate (cert)", f"key {key}")
    message = refused(tmp_path, yaml.safe_dump({"tls_server_config": {"cert_file": str(crt), "key_file": "nokey"}}))
    assert_mentions(message, "cannot load", f"certificate {crt}", f"key {tmp_path / 'nokey'}", "No such file")


def test_both_key_and_key_file_use_the_file(tmp_path: Path, ca: trustme.CA) -> None:
    crt, key = tls_files(tmp_path, ca)
    config = load(tmp_path, yaml.safe_dump({"tls_server_config": {"cert_file": str(crt), "key_file": str(key),
                                                                   "key": "ignored"}}))  # fmt: skip
    assert config.tls is not None
    warning = only_warning(config)
    assert_mentions(warning, "tls_server_config", "key and key_file", "key_file is used", "exporter-toolkit")


def test_client_ca_sentences(certs: Path) -> None:
    message = refused(certs, TLS + "client_auth_type: VerifyClientCertIfGiven, client_ca_file: nofile}")
    assert_mentions(message, "cannot load", f"client CA file {certs / 'nofile'}", "No such file")
    for ca_text, reason in (("not a certificate", "no start line"), ("caf\u00e9", "ASCII")):
        message = refused(certs, yaml.safe_dump({"tls_server_config": {
            "cert_file": "server.crt", "key_file": "server.key", "client_auth_type": "VerifyClientCertIfGiven",
            "client_ca": ca_text}}, allow_unicode=True))  # fmt: skip
        assert_mentions(message, "cannot load", "the inline client CA (client_ca)", reason)


def test_an_absolute_path_is_read_as_it_is(tmp_path: Path, ca: trustme.CA) -> None:
    (tmp_path / "certs").mkdir()
    crt, key = tls_files(tmp_path / "certs", ca)
    other = tmp_path / "conf"
    other.mkdir()
    config = load(other, yaml.safe_dump({"tls_server_config": {"cert_file": str(crt), "key_file": str(key)}}))
    assert config.files == (other / "web.yml", crt, key)


def test_certificate_names_as_go_writes_them() -> None:
    from gpu_exporter.web.tls_context import certificate_names

    cert = {"subjectAltName": (("DirName", ((("commonName", "x"),),)), ("DNS", "a.example"),
                               ("othername", "<unsupported>"), ("IP Address", "2001:DB8:0:0:0:0:0:1\n"),
                               ("IP Address", "192.0.2.1"), ("IP Address", "<invalid>"), ("email", "a@example.org"),
                               ("URI", "spiffe://x/y"), ("Registered ID", "1.2.3"))}  # fmt: skip
    assert certificate_names(cert) == {"a.example", "2001:db8::1", "192.0.2.1", "<invalid>", "a@example.org",
                                       "spiffe://x/y"}  # fmt: skip
    assert certificate_names(None) == set() and certificate_names({}) == set()


def test_a_web_config_that_cannot_be_read_is_named_as_the_web_config_file(tmp_path: Path) -> None:
    """What the admin must look at: which file, and that it is the web config (not the exporter's)."""
    missing = tmp_path / "web.yml"
    with pytest.raises(WebConfigError) as e:
        load_web_config(missing)
    assert_mentions(str(e.value), "web config file", str(missing))
    missing.write_bytes(b"tls_server_config: \xff\n")
    with pytest.raises(WebConfigError) as e:
        load_web_config(missing)
    assert_mentions(str(e.value), "web config file", "UTF-8")
