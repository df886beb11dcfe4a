"""Credential shapes: what a plain setting (written in clear to the preview, unit files, command
lines and the deploy's diffs) must never hold. One rule for every string setting (schema.py),
for every message that echoes a value (errors.shown), and for the preview's files
(tests/unit/test_preview_secrets.py).

The vendors' shapes come from a maintained detector, Yelp's detect-secrets (PyPI
detect-secrets 1.5.0, detect_secrets/plugins/*.py): every one of its regex plugins for a token
with a published prefix or format, or a keyword assignment (`cloudant_password = <64 hex>`).
Four of its 27 plugins are left out (tests/unit/test_site_meaning.py holds the list to the
installed package): the high-entropy ones (Base64HighEntropyString, HexHighEntropyString) and
KeywordDetector flag hashes, model names and words like "password" in a description, and
IPPublicDetector flags every public IPv4 address, which is what ssh_hostname and guest_ip hold:
a setting refused by a guess is worse than none. Shapes detect-secrets 1.5.0 does not know are
added below, each with its source. A URL's user part is judged here too (a token alone before '@' is a
credential, which BasicAuthDetector, wanting user:password, does not see)."""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

from detect_secrets.plugins.artifactory import ArtifactoryDetector
from detect_secrets.plugins.aws import AWSKeyDetector
from detect_secrets.plugins.azure_storage_key import AzureStorageKeyDetector
from detect_secrets.plugins.base import RegexBasedDetector
from detect_secrets.plugins.basic_auth import BasicAuthDetector
from detect_secrets.plugins.cloudant import CloudantDetector
from detect_secrets.plugins.discord import DiscordBotTokenDetector
from detect_secrets.plugins.github_token import GitHubTokenDetector
from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
from detect_secrets.plugins.ibm_cloud_iam import IbmCloudIamDetector
from detect_secrets.plugins.ibm_cos_hmac import IbmCosHmacDetector
from detect_secrets.plugins.jwt import JwtTokenDetector
from detect_secrets.plugins.mailchimp import MailchimpDetector
from detect_secrets.plugins.npm import NpmDetector
from detect_secrets.plugins.openai import OpenAIDetector
from detect_secrets.plugins.private_key import PrivateKeyDetector
from detect_secrets.plugins.pypi_token import PypiTokenDetector
from detect_secrets.plugins.sendgrid import SendGridDetector
from detect_secrets.plugins.slack import SlackDetector
from detect_secrets.plugins.softlayer import SoftlayerDetector
from detect_secrets.plugins.square_oauth import SquareOAuthDetector
from detect_secrets.plugins.stripe import StripeDetector
from detect_secrets.plugins.telegram_token import TelegramBotTokenDetector
from detect_secrets.plugins.twilio import TwilioKeyDetector

DETECTORS: tuple[RegexBasedDetector, ...] = tuple(
    plugin()
    for plugin in (
        ArtifactoryDetector,
        AWSKeyDetector,
        AzureStorageKeyDetector,
        BasicAuthDetector,
        CloudantDetector,
        DiscordBotTokenDetector,
        GitHubTokenDetector,
        GitLabTokenDetector,
        IbmCloudIamDetector,
        IbmCosHmacDetector,
        JwtTokenDetector,
        MailchimpDetector,
        NpmDetector,
        OpenAIDetector,
        PrivateKeyDetector,
        PypiTokenDetector,
        SendGridDetector,
        SlackDetector,
        SoftlayerDetector,
        SquareOAuthDetector,
        StripeDetector,
        TelegramBotTokenDetector,
        TwilioKeyDetector,
    )
)

# Shapes detect-secrets 1.5.0 lacks: (name, pattern, where it is published).
EXTRA_SHAPES: tuple[tuple[str, re.Pattern, str], ...] = (
    # huggingface_hub's user access tokens: hf_ and 34 letters and digits (30 or more here).
    (
        "Hugging Face Token",
        re.compile(r"(?<![A-Za-z0-9])hf_[A-Za-z0-9]{30,}"),
        "huggingface.co/docs/hub/security-tokens",
    ),
    # OpenAI's keys (sk-..., sk-proj-...): detect-secrets' OpenAIDetector knows the legacy shape only.
    ("OpenAI API Key", re.compile(r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_-]{20,}"), "platform.openai.com/docs/api-reference"),
    # GitHub's fine-grained personal access tokens (github_pat_ and 82 characters).
    (
        "GitHub Token",
        re.compile(r"github_pat_[A-Za-z0-9_]{22,}"),
        "github.blog/2022-10-18-introducing-fine-grained-personal-access-tokens-for-github",
    ),
    # Google Cloud API keys: AIza and 35 characters (cloud.google.com/docs/authentication/api-keys).
    ("Google API Key", re.compile(r"AIza[0-9A-Za-z_-]{35}"), "cloud.google.com/docs/authentication/api-keys"),
    # npm's access tokens (npm_ and 36 letters and digits): NpmDetector knows them only on an
    # .npmrc `//registry/:_authToken=` line.
    (
        "NPM tokens",
        re.compile(r"(?<![A-Za-z0-9])npm_[A-Za-z0-9]{36}"),
        "github.blog/2021-09-23-announcing-npms-new-access-token-format",
    ),
    # NVIDIA NGC / build.nvidia.com API keys: nvapi- and 64 letters, digits, '-' and '_' (32 or more here).
    (
        "NVIDIA NGC API Key",
        re.compile(r"(?<![A-Za-z0-9])nvapi-[A-Za-z0-9_-]{32,}"),
        "docs.nvidia.com/ngc/gpu-cloud/ngc-user-guide (Generating an API Key)",
    ),
    # user:password@host without a scheme (an SMTP relay's host:port, a mirror written bare):
    # RFC 3986 section 3.2.1's userinfo, which BasicAuthDetector only sees after '://'.
    (
        "User and password before a host",
        re.compile(r"(?<![/\w.+~%:-])[A-Za-z0-9._~%-]+:[A-Za-z0-9._~%!$&'()*+,;=-]+(?=@[A-Za-z0-9\[])"),
        "www.rfc-editor.org/rfc/rfc3986#section-3.2.1",
    ),
)

# A user part of a URL made only of token characters and this long is taken for a token
# (https://TOKEN@host/...: GitHub, GitLab and most package mirrors take it so); a plain user
# name (deploy, mirror-user) is shorter or has no digits.
TOKEN_USER_RE = re.compile(r"[A-Za-z0-9_\-.~]{16,}")
URL_RE = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]+")

# Query parameters that carry a credential in the URLs of the services a setting may name: OAuth
# 2.0's access_token (RFC 6750 section 2.3), Azure's SAS sig (learn.microsoft.com, "Create a service
# SAS"), S3's and GCS's presigned X-Amz-Signature / X-Amz-Credential / X-Amz-Security-Token and
# X-Goog-Signature / X-Goog-Credential (AWS Signature Version 4, "Authenticating Requests: Using
# Query Parameters"), and the generic names services use for a token, key or password. A URL
# setting with any of these, with a value, holds a credential in clear.
QUERY_CREDENTIALS = frozenset(
    {
        *("token", "access_token", "refresh_token", "id_token", "auth", "auth_token", "authorization"),
        *("key", "api_key", "apikey", "api-key", "access_key", "secret", "secret_key", "client_secret"),
        *("password", "passwd", "pwd", "pass", "sig", "signature", "private_token", "session_token"),
        *("x-amz-signature", "x-amz-credential", "x-amz-security-token", "x-goog-signature"),
        *("x-goog-credential", "x-goog-security-token"),
    }
)
_QUERY_PART_RE = re.compile(r"(?<=[?&;])([^=&;#\s]+)=([^&;#\s\"'<>]+)")

# Which vault key a credential found in a setting belongs in: the *_secret setting that names it.
VAULT_SETTING = {
    "Hugging Face Token": "serving_hf_token_secret",
    "OpenAI API Key": "serving_api_key_secret",
}


# Some of the detectors' patterns take time quadratic in a run of matching characters
# (JwtTokenDetector's on 'eyJeyJ...': 22 s for 180,000 characters): a long value is scanned in
# windows of WINDOW characters that overlap by OVERLAP, so a value of any length is judged in
# time linear in its length, and a credential up to OVERLAP characters long is never split.
WINDOW, OVERLAP = 8192, 2048


def found_credentials(text: str) -> list[tuple[str, int, int]]:
    """(kind, start, end) of each credential-shaped part of text, sorted by start."""
    if len(text) <= WINDOW:
        return _found_in(text)
    found = set()
    for offset in range(0, len(text) - OVERLAP, WINDOW - OVERLAP):
        found |= {(kind, offset + a, offset + b) for kind, a, b in _found_in(text[offset : offset + WINDOW])}
    return sorted(found, key=lambda f: (f[1], -f[2]))


def _found_in(text: str) -> list[tuple[str, int, int]]:
    """found_credentials of one window. The detectors' own regexes are matched here
    (RegexBasedDetector.analyze_string yields a pattern's first group, which for
    GitHubTokenDetector is the prefix alone): the whole match is the credential."""
    found = []
    for detector in DETECTORS:
        for pattern in detector.denylist:
            for match in pattern.finditer(text):
                if isinstance(detector, JwtTokenDetector) and not detector.is_formally_valid(match.group()):
                    continue
                found.append((detector.secret_type, match.start(), match.end()))
    for kind, pattern, _ in EXTRA_SHAPES:
        found.extend((kind, m.start(), m.end()) for m in pattern.finditer(text))
    for match in URL_RE.finditer(text):
        user = _url_user(match.group())
        if not user:
            continue
        start = match.start() + match.group().index("://") + 3
        name, colon, password = user.partition(":")
        if colon and password:
            found.append(("URL with a password", start + len(name) + 1, start + len(user)))
        elif not colon and _looks_like_token(user):
            found.append(("URL with a token as its user part", start, start + len(user)))
    for match in URL_RE.finditer(text):
        found.extend(_query_credentials(match.group(), match.start()))
    return sorted(found, key=lambda f: (f[1], -f[2]))


def _query_credentials(url: str, offset: int) -> list[tuple[str, int, int]]:
    """The values of a URL's query parameters named like a credential (QUERY_CREDENTIALS)."""
    query_start = url.find("?")
    if query_start < 0:
        return []
    found = []
    for part in _QUERY_PART_RE.finditer(url, query_start):
        name = unquote(part.group(1)).lower()
        if name in QUERY_CREDENTIALS:
            found.append(
                (f"URL with a credential in its query ({name}=)", offset + part.start(2), offset + part.end(2))
            )
    return found


def credential_kind(text: str) -> str | None:
    """The first kind of credential text holds, or None."""
    found = found_credentials(text)
    return found[0][0] if found else None


def _url_user(url: str) -> str | None:
    try:
        netloc = urlsplit(url).netloc
    except ValueError:
        return None
    return netloc.rpartition("@")[0] or None


def _looks_like_token(user: str) -> bool:
    return bool(TOKEN_USER_RE.fullmatch(user) and re.search(r"\d", user) and re.search(r"[A-Za-z]", user))


def masked(text: str) -> str:
    """text with each credential replaced by its first four characters (none of one shorter than
    16) and a mark (a message or
    the preview may say which value it was, never the value)."""
    spans = found_credentials(text)
    if not spans:
        return text
    out, position = [], 0
    for _, start, end in spans:
        if end <= position:
            continue
        start = max(start, position)
        shown = 4 if end - start >= 16 else 0  # a short one (a query's sig=abc) is hidden whole
        out.append(text[position:start] + text[start : start + shown] + "…(hidden)")
        position = end
    return "".join(out) + text[position:]
