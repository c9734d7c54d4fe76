"""SSRF: every way of writing a private, loopback or link-local address is refused.

The guard (controlplane/alerts/ssrf.py) is exercised directly with generated addresses in
each IPv6 form that embeds an IPv4 one (mapped, compatible, NAT64, 6to4, Teredo), with the
numeric spellings a resolver accepts (decimal, hex, octal, short), and through the API, which
must answer 400 and store nothing.
"""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.alerts.ssrf import AllowList, UnsafeTarget, check_url, check_url_static
from tests.integration.api_support import make_user, token_client

PRIVATE_V4 = ["127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
              "169.254.0.0/16", "100.64.0.0/10", "0.0.0.0/8", "198.18.0.0/15"]


@st.composite
def private_v4(draw) -> ipaddress.IPv4Address:
    net = ipaddress.IPv4Network(draw(st.sampled_from(PRIVATE_V4)))
    return net[draw(st.integers(0, net.num_addresses - 1))]


def v6_forms(v4: ipaddress.IPv4Address) -> dict[str, str]:
    n = int(v4)
    teredo_client = n ^ 0xFFFFFFFF  # Teredo stores the client address inverted
    return {
        "mapped": f"::ffff:{v4}",
        "compatible": str(ipaddress.IPv6Address(n)) if n > 1 else f"::ffff:{v4}",
        "nat64": str(ipaddress.IPv6Address((0x64FF9B << 96) | n)),
        "nat64-local": str(ipaddress.IPv6Address((0x64FF9B0001 << 80) | n)),
        "6to4": str(ipaddress.IPv6Address((0x2002 << 112) | (n << 80) | 1)),
        "teredo": str(ipaddress.IPv6Address((0x20010000 << 96) | (0x08080808 << 64)
                                            | teredo_client)),
    }


NO_ALLOW = AllowList()


@given(address=private_v4(), form=st.sampled_from(["mapped", "compatible", "nat64",
                                                   "nat64-local", "6to4", "teredo"]))
def test_every_ipv6_form_of_a_private_ipv4_is_refused(address, form):
    literal = v6_forms(address)[form]
    with pytest.raises(UnsafeTarget):
        check_url_static(f"http://[{literal}]/hook", NO_ALLOW)
    with pytest.raises(UnsafeTarget):
        check_url(f"https://[{literal}]:8443/hook", NO_ALLOW, resolve=lambda h, p: [literal])


@given(address=private_v4())
def test_dns_answers_in_any_form_are_refused(address):
    # A public-looking name that resolves to a private address in some form.
    for literal in [str(address), *v6_forms(address).values()]:
        with pytest.raises(UnsafeTarget):
            check_url("https://hooks.example.com/x", NO_ALLOW,
                      resolve=lambda h, p, lit=literal: ["203.0.113.7", lit])


@pytest.mark.parametrize("url", [
    "http://2130706433/", "http://0x7f000001/", "http://0177.0.0.1/", "http://127.1/",
    "http://0/", "http://017700000001/", "http://localhost./", "http://LOCALHOST/",
    "http://api.localhost/", "http://[::]/", "http://[0:0:0:0:0:ffff:7f00:1]/",
    "http://169.254.169.254/latest/meta-data/", "http://[fd00:ec2::254]/",
])
def test_numeric_and_local_spellings_are_refused_when_sending(url):
    with pytest.raises(UnsafeTarget):
        check_url(url, NO_ALLOW)  # the system resolver parses the numeric forms


@pytest.mark.parametrize("url", ["http://user:pw@8.8.8.8/", "ftp://8.8.8.8/",
                                 "gopher://127.0.0.1:70/", "http:///nohost", "http://[::1/"])
def test_malformed_and_credential_urls_are_refused(url):
    with pytest.raises(UnsafeTarget):
        check_url_static(url, NO_ALLOW)


@pytest.mark.django_db
@pytest.mark.parametrize("host", ["[64:ff9b::7f00:1]", "[2002:a9fe:a9fe::1]", "[::10.0.0.1]",
                                  "[::ffff:192.168.1.1]", "127.0.0.1", "localhost"])
def test_api_refuses_private_targets_and_stores_nothing(settings, host):
    from controlplane.alerts.models import WebhookEndpoint

    settings.ALERTS_WEBHOOK_ALLOW = []
    admin = token_client(make_user("admin", "ssrf-admin"))[0]
    response = admin.post("/api/v1/webhook-endpoints/",
                          {"name": "probe", "url": f"http://{host}/hook"}, format="json")
    assert response.status_code == 400, response.content
    assert "url" in response.json()["error"]["fields"]
    assert not WebhookEndpoint.objects.exists()
