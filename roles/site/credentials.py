"""Credential shapes: what a plain setting (written in clear to the preview, unit files, command
lines and the deploy's diffs) must never hold. One rule for every string setting (schema.py),
for every message that echoes a value (errors.shown), and for the preview's files
(tests/unit/test_preview_secrets.py).

The vendors' shapes come from a maintained detector, Yelp's detect-secrets (PyPI
detect-secrets 1.5.0, detect_secrets/plugins/*.py): its regex plugins for tokens with a
published prefix or format. Its high-entropy and keyword plugins are left out: they flag
hashes, model names and words like "password" in a description, and a setting refused by a
guess is worse than none. Shapes detect-secrets 1.5.0 does not know are added below, each
with its source. A URL's user part is judged here too (a token alone before '@' is a
credential, which BasicAuthDetector, wanting user:password, does not see)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from detect_secrets.plugins.aws import AWSKeyDetector
from detect_secrets.plugins.base import RegexBasedDetector
from detect_secrets.plugins.basic_auth import BasicAuthDetector
from detect_secrets.plugins.discord import DiscordBotTokenDetector
from detect_secrets.plugins.github_token import GitHubTokenDetector
from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
from detect_secrets.plugins.jwt import JwtTokenDetector
from detect_secrets.plugins.mailchimp import MailchimpDetector
from detect_secrets.plugins.openai import OpenAIDetector
from detect_secrets.plugins.private_key import PrivateKeyDetector
from detect_secrets.plugins.pypi_token import PypiTokenDetector
from detect_secrets.plugins.sendgrid import SendGridDetector
from detect_secrets.plugins.slack import SlackDetector
from detect_secrets.plugins.square_oauth import SquareOAuthDetector
from detect_secrets.plugins.stripe import StripeDetector
from detect_secrets.plugins.telegram_token import TelegramBotTokenDetector
from detect_secrets.plugins.twilio import TwilioKeyDetector

DETECTORS: tuple[RegexBasedDetector, ...] = tuple(
    plugin()
    for plugin in (
        AWSKeyDetector,
        BasicAuthDetector,
        DiscordBotTokenDetector,
        GitHubTokenDetector,
        GitLabTokenDetector,
        JwtTokenDetector,
        MailchimpDetector,
        OpenAIDetector,
        PrivateKeyDetector,
        PypiTokenDetector,
        SendGridDetector,
        SlackDetector,
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
    return sorted(found, key=lambda f: (f[1], -f[2]))


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
    """text with each credential replaced by its first four characters and a mark (a message or
    the preview may say which value it was, never the value)."""
    spans = found_credentials(text)
    if not spans:
        return text
    out, position = [], 0
    for _, start, end in spans:
        if end <= position:
            continue
        start = max(start, position)
        out.append(text[position:start] + text[start : min(start + 4, end)] + "…(hidden)")
        position = end
    return "".join(out) + text[position:]
