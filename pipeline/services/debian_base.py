"""The Debian base image's tree: the mirror apt uses here, ``debootstrap``, and the trimming
that makes its output an image. (layer: services)

:class:`pipeline.services.docker_images.Builder` makes ``skewer-local/debian:bookworm`` with
these: ``debootstrap --variant=minbase`` from the mirror of this machine's apt sources
(:func:`host_mirrors`), deploy/images/debian/rootfs/ laid over the tree, what no image needs
taken out (:func:`trim_rootfs`) and this machine's own CA certificates put in
(:func:`add_local_certificates`); docs/compose.md says when to build the local images.

Example (nothing is run):
    >>> sources = parse_apt_sources("deb [arch=amd64] http://mirror.example/debian bookworm main")
    >>> host_mirrors(sources)
    ('http://mirror.example/debian', 'http://deb.debian.org/debian-security')
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pipeline.services import docker_engine

#: The Debian release of every image (the native services' packages are bookworm's too).
SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_SECURITY_MIRROR = "http://deb.debian.org/debian-security"
#: The archive key debootstrap checks the mirror's signatures with (Debian's own, on any Debian).
ARCHIVE_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
#: Certificate authorities this machine's administrator added (Debian's place for them): the
#: base takes them along, so that builds trust what the host trusts (a TLS-inspecting proxy).
LOCAL_CERTIFICATES = Path("/usr/local/share/ca-certificates")
#: The URL schemes of a mirror debootstrap can use.
_MIRROR_SCHEMES = ("http://", "https://", "file:/")
#: What of the debootstrapped tree no image needs: manuals, translations (glibc's locale.alias
#: stays) and documentation (the licences stay); the base's dpkg excludes keep the packages
#: images install later from adding them (deploy/images/debian/rootfs/etc/dpkg/dpkg.cfg.d/).
_TRIMMED = ("usr/share/man", "usr/share/info", "usr/share/lintian")
_KEPT = {"usr/share/doc": "copyright", "usr/share/locale": "locale.alias"}


class ImageError(Exception):
    """An image could not be built, or no engine answers; the message is one line."""


# --------------------------------------------------------------------------------------------
# The mirror apt uses


@dataclass(frozen=True)
class AptSource:
    """One entry of apt's sources: a ``deb`` line, or a deb822 stanza of ``.sources``."""

    types: tuple[str, ...]
    uris: tuple[str, ...]
    suites: tuple[str, ...]


def _one_line_sources(text: str) -> list[AptSource]:
    sources = []
    for line in text.splitlines():
        line = re.sub(r"\[[^\]]*\]", " ", line.split("#", 1)[0])  # comments, [options]
        words = line.split()
        if len(words) >= 3:
            sources.append(AptSource((words[0],), (words[1],), (words[2],)))
    return sources


def _deb822_sources(text: str) -> list[AptSource]:
    sources = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        name = None
        for line in stanza.splitlines():
            if line.startswith("#"):
                continue
            if line[:1].isspace() and name is not None:  # a continuation line
                fields[name] += " " + line.strip()
            elif ":" in line:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                fields[name] = value.strip()
        if fields.get("enabled", "yes").lower() == "no":
            continue
        if {"types", "uris", "suites"} <= set(fields):
            sources.append(
                AptSource(
                    tuple(fields["types"].split()),
                    tuple(fields["uris"].split()),
                    tuple(fields["suites"].split()),
                )
            )
    return sources


def parse_apt_sources(text: str, *, deb822: bool = False) -> list[AptSource]:
    """The entries of one apt sources file: one-line ``sources.list`` syntax, or deb822 (a
    ``.sources`` file) when ``deb822``. Comments, options and disabled stanzas are skipped.

    >>> parse_apt_sources("deb http://d.example/debian bookworm main # the main archive")
    [AptSource(types=('deb',), uris=('http://d.example/debian',), suites=('bookworm',))]
    >>> parse_apt_sources("Types: deb\\nURIs: http://a/ http://b/\\nSuites: bookworm\\n"
    ...                   "Components: main\\n", deb822=True)[0].uris
    ('http://a/', 'http://b/')
    """
    return _deb822_sources(text) if deb822 else _one_line_sources(text)


def read_host_sources(apt_dir: Path = Path("/etc/apt")) -> list[AptSource]:
    """apt's sources on this machine: ``sources.list``, then ``sources.list.d/*.list`` and
    ``*.sources`` in name order (apt's own order). Unreadable files count as empty."""
    files = [apt_dir / "sources.list"]
    parts = apt_dir / "sources.list.d"
    if parts.is_dir():
        files += sorted(p for p in parts.iterdir() if p.suffix in (".list", ".sources"))
    sources = []
    for path in files:
        try:
            text = path.read_text()
        except OSError:
            continue
        sources += parse_apt_sources(text, deb822=path.suffix == ".sources")
    return sources


def _first_uri(sources: Iterable[AptSource], suite: str) -> str | None:
    for source in sources:
        if "deb" not in source.types or suite not in source.suites:
            continue
        for uri in source.uris:
            if uri.startswith(_MIRROR_SCHEMES):
                return uri.rstrip("/")
    return None


def host_mirrors(sources: Iterable[AptSource], suite: str = SUITE) -> tuple[str, str]:
    """(archive, security archive) of ``suite`` in apt's ``sources``: the first ``deb`` entry
    of ``suite`` (``suite-security``) with an http(s) or file URI, else Debian's own.

    >>> entries = parse_apt_sources(
    ...     "Types: deb\\nURIs: http://m.example/debian/\\nSuites: bookworm bookworm-updates\\n\\n"
    ...     "Types: deb\\nURIs: http://m.example/debian-security\\nSuites: bookworm-security\\n",
    ...     deb822=True)
    >>> host_mirrors(entries)
    ('http://m.example/debian', 'http://m.example/debian-security')
    >>> host_mirrors(parse_apt_sources("deb http://archive.ubuntu.com/ubuntu noble main"))
    ('http://deb.debian.org/debian', 'http://deb.debian.org/debian-security')
    """
    sources = list(sources)
    archive = _first_uri(sources, suite) or DEFAULT_MIRROR
    security = _first_uri(sources, f"{suite}-security") or DEFAULT_SECURITY_MIRROR
    return archive, security


def image_apt_sources(archive: str, security: str, suite: str = SUITE) -> str:
    """The base image's ``/etc/apt/sources.list.d/debian.sources``: the release, its updates
    and its security archive, as Debian's own images list them, from the host's mirrors.

    >>> print(image_apt_sources("http://m/debian", "http://m/debian-security"))
    Types: deb
    URIs: http://m/debian
    Suites: bookworm bookworm-updates
    Components: main
    Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
    <BLANKLINE>
    Types: deb
    URIs: http://m/debian-security
    Suites: bookworm-security
    Components: main
    Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
    <BLANKLINE>
    """
    stanzas = [(archive, f"{suite} {suite}-updates"), (security, f"{suite}-security")]
    return "\n".join(
        f"Types: deb\nURIs: {uri}\nSuites: {suites}\nComponents: main\n"
        f"Signed-By: {ARCHIVE_KEYRING}\n"
        for uri, suites in stanzas
    )


# --------------------------------------------------------------------------------------------
# The tree


def debootstrap_command(rootfs: Path, mirror: str, cache: Path, suite: str = SUITE) -> list[str]:
    """The base's ``debootstrap``: the smallest system with apt (minbase), its packages kept in
    ``cache`` for a later ``--rebuild``.

    >>> " ".join(debootstrap_command(Path("/r"), "http://m/debian", Path("/c")))
    'debootstrap --variant=minbase --cache-dir=/c --keyring=... bookworm /r http://m/debian'
    """
    return [
        "debootstrap",
        "--variant=minbase",
        f"--cache-dir={cache}",
        f"--keyring={ARCHIVE_KEYRING}",
        suite,
        str(rootfs),
        mirror,
    ]


def _mounts_under(folder: Path) -> list[Path]:
    """Mount points at or under ``folder``, deepest first."""
    mounts = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point = Path(line.split()[1].replace("\\040", " "))
        if point == folder or folder in point.parents:
            mounts.append(point)
    return sorted(mounts, key=lambda point: len(point.parts), reverse=True)


def unmount_all(folder: Path) -> None:
    """Unmount whatever is mounted at or under ``folder`` (debootstrap mounts ``/proc`` and
    ``/sys`` in its tree and may leave them when it fails); an ImageError if a mount stays."""
    for mount in _mounts_under(folder):
        docker_engine.unmount(mount)
    left = _mounts_under(folder)
    if left:
        raise ImageError(f"{left[0]} is still mounted; unmount it and build again")


def remove_tree(folder: Path) -> None:
    """Remove a debootstrapped tree: its mounts first, then its files, never crossing into
    another file system (``rm --one-file-system``)."""
    if not folder.exists():
        return
    unmount_all(folder)
    subprocess.run(["rm", "-rf", "--one-file-system", str(folder)], check=True)


def trim_rootfs(rootfs: Path, overlay: Path, sources: str) -> None:
    """Make a debootstrapped tree the base image: lay ``overlay`` over it, write apt's
    ``sources`` (deb822) in place of debootstrap's ``sources.list``, and take out what no
    image needs: manuals, translations, documentation (the licences stay), apt's lists and
    caches, the install logs.
    """
    if overlay.is_dir():
        shutil.copytree(overlay, rootfs, symlinks=True, dirs_exist_ok=True)
    apt = rootfs / "etc" / "apt"
    (apt / "sources.list").unlink(missing_ok=True)
    (apt / "sources.list.d").mkdir(parents=True, exist_ok=True)
    (apt / "sources.list.d" / "debian.sources").write_text(sources)
    for folder in _TRIMMED:
        shutil.rmtree(rootfs / folder, ignore_errors=True)
    for folder, kept in _KEPT.items():
        top = rootfs / folder
        paths = top.rglob("*") if top.is_dir() else ()
        for path in sorted(paths, key=lambda p: len(p.parts), reverse=True):  # children first
            if path.is_dir() and not path.is_symlink():
                if not any(path.iterdir()):
                    path.rmdir()
            elif path.name != kept:
                path.unlink()
    for pattern in ("var/lib/apt/lists/*", "var/cache/apt/*.bin", "var/cache/apt/archives/*.deb"):
        for path in rootfs.glob(pattern):
            if path.is_file():
                path.unlink()
    for log in ("var/log/dpkg.log", "var/log/bootstrap.log", "var/log/alternatives.log"):
        (rootfs / log).unlink(missing_ok=True)


def add_local_certificates(rootfs: Path, source: Path = LOCAL_CERTIFICATES) -> list[str]:
    """Copy the host's own CA certificates (``*.crt`` of ``source``) to the same place in
    ``rootfs``; an image that installs ``ca-certificates`` then trusts them too (its
    post-install adds them to /etc/ssl/certs, and Java's trust store follows). Their names."""
    names = []
    target = rootfs / source.relative_to("/")
    for certificate in sorted(source.glob("*.crt")) if source.is_dir() else ():
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(certificate, target / certificate.name)
        names.append(certificate.name)
    return names
