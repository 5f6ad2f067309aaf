"""Which environment variables a request may never set for a root job (like sudo's env_reset).

A root job's HOME, USER, LOGNAME, SHELL and PATH come from root's passwd entry
and a fixed secure path, never from the request: a request naming one of
them is refused, never silently dropped.  The other names here change what a
program loads, runs or trusts (libraries, interpreter start-up code, config
files, helper commands, hooks, trust stores); they follow sudo's
``env_delete`` list (plugins/sudoers/env.c ``initial_badenv_table``) and
glibc's ``UNSECURE_ENVVARS``, plus the tools a root job on Debian commonly
runs that take a command, a hook or a config file from the environment
(apt, dpkg, systemctl, rsync, vim, Lua, Java, Node, Ruby, OpenSSL, ...).
Like sudo's ``env_check``, the locale and terminal names may not hold a ``/``
or ``%`` (a path or a format), and ``TZ`` must pass sudo's ``tz_is_sane``.
docs/security.md lists them with the reasons.

A deny list is never complete: `wildcard_refusal` is why ``env.allow`` may not
hold a wildcard that admits any of these names (checked when the
configuration is loaded), so each name a root job gets was written down by an
operator.

Pure: no I/O.  Intake (validation) and the runner (the re-check) both ask `refusal`;
the configuration asks `wildcard_refusal`.
"""

from __future__ import annotations

# Set from the target user's passwd entry and the secure path, never by a request.
RESET_NAMES = ("HOME", "LOGNAME", "PATH", "SHELL", "USER")

DANGEROUS_NAMES = frozenset(
    {
        # shells: start-up files, word splitting, prompts, functions, editors
        "ENV",
        "KSH_ENV",
        "IFS",
        "CDPATH",
        "PS4",
        "GLOBIGNORE",
        "BASHOPTS",
        "SHELLOPTS",
        "FPATH",
        "NULLCMD",
        "READNULLCMD",
        "ZDOTDIR",
        "TMPPREFIX",
        "PROMPT_COMMAND",
        "FCEDIT",
        # glibc's unsecure variables (ignored for setuid programs, not for root jobs)
        "GCONV_PATH",
        "GETCONF_DIR",
        "GLIBC_TUNABLES",
        "HOSTALIASES",
        "LOCALDOMAIN",
        "LOCPATH",
        "NIS_PATH",
        "NLSPATH",
        "PATH_LOCALE",
        "RES_OPTIONS",
        "RESOLV_HOST_CONF",
        "TMPDIR",
        "TZDIR",
        # terminal databases
        "TERMINFO",
        "TERMINFO_DIRS",
        "TERMPATH",
        "TERMCAP",
        # interpreters' start-up code and module paths
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "JDK_JAVA_OPTIONS",
        "CLASSPATH",
        "RUBYLIB",
        "RUBYOPT",
        "GEM_HOME",
        "GEM_PATH",
        "BUNDLE_GEMFILE",
        "PHPRC",
        "PHP_INI_SCAN_DIR",
        "TCLLIBPATH",
        "VIMINIT",
        "EXINIT",
        "MYVIMRC",
        "VIMRUNTIME",
        "GIO_EXTRA_MODULES",
        "GTK_MODULES",
        "GTK_PATH",
        "QT_PLUGIN_PATH",
        # Kerberos and helpers that run a command named in the environment
        "KRB5_CONFIG",
        "KRB5_KTNAME",
        "PAGER",
        "EDITOR",
        "VISUAL",
        "SUDO_EDITOR",
        "BROWSER",
        "MANPAGER",
        "MANOPT",
        "SSH_ASKPASS",
        "SSH_ASKPASS_REQUIRE",
        "SUDO_ASKPASS",
        "CVS_RSH",
        "SVN_SSH",
        "SVN_EDITOR",
        "HGRCPATH",
        "TAR_OPTIONS",
        "MAKEFILES",
        "MAKEFLAGS",
        "MFLAGS",
        "GNUMAKEFLAGS",
        "GOFLAGS",
        "GOENV",
        "GOTOOLCHAIN",
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTDOC",
        "KUBECONFIG",
        "DOCKER_CONFIG",
        "AWS_CONFIG_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
        "CLOUDSDK_CONFIG",
        "CURL_HOME",
        "WGETRC",
        "NETRC",
        "GNUPGHOME",
        "DBUS_SESSION_BUS_ADDRESS",
        "DBUS_SYSTEM_BUS_ADDRESS",
        # what TLS trusts, and where its secrets go
        "SSLKEYLOGFILE",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "CURL_CA_BUNDLE",
        "REQUESTS_CA_BUNDLE",
    }
)
DANGEROUS_PREFIXES = (
    "LD_",
    "_RLD",
    "DYLD_",
    "MALLOC_",
    "PYTHON",
    "PERL",  # PERL5LIB, PERL5OPT, PERL5DB, PERL5SHELL, PERLLIB, PERLIO_DEBUG
    "BASH_",  # BASH_ENV, BASH_FUNC_*, BASH_LOADABLES_PATH, BASH_XTRACEFD
    "__BASH_FUNC",
    "GIT_",
    "APT_",  # APT_CONFIG: a config file whose hooks (APT::Update::Pre-Invoke) run as root
    "DPKG_",  # DPKG_PAGER, DPKG_SHELL run commands
    "DEBCONF_",  # DEBCONF_DB_OVERRIDE and friends: another answers database
    "SYSTEMD_",  # SYSTEMD_EDITOR, SYSTEMD_PAGER, SYSTEMD_LESS
    "RSYNC_",  # RSYNC_RSH, RSYNC_CONNECT_PROG run commands
    "LUA_",  # LUA_INIT, LUA_INIT_5_4, LUA_PATH, LUA_CPATH
    "NODE_",  # NODE_OPTIONS (--require), NODE_PATH, NODE_EXTRA_CA_CERTS
    "npm_config_",
    "NPM_CONFIG_",
    "PIP_",
    "CARGO_",
    "OPENSSL_",  # OPENSSL_CONF, OPENSSL_MODULES, OPENSSL_ENGINES load code
    "LESS",  # LESS (+!cmd), LESSOPEN, LESSCLOSE, LESSKEY, LESSKEYIN, LESSSECURE
    "XDG_",  # XDG_CONFIG_HOME/DIRS, XDG_DATA_*: where tools read their configuration
    "GST_PLUGIN_",
)
# sudo's env_check: these may not hold a path or a format (glibc loads a locale from a path).
CHECKED_NAMES = frozenset({"COLORTERM", "LANG", "LANGUAGE", "LINGUAS", "TERM"})
CHECKED_PREFIXES = ("LC_",)
ZONEINFO = "/usr/share/zoneinfo"
PATH_MAX = 4096


def denied(name: str) -> bool:
    """Whether a request may never set ``name`` for a root job, whatever its value."""
    return name in RESET_NAMES or name in DANGEROUS_NAMES or name.startswith(DANGEROUS_PREFIXES)


def refusal(name: str, value: str | None = None) -> str | None:
    """Why a request may not set ``name`` (to ``value``) for a root job, or None if it may."""
    if name in RESET_NAMES:
        return (
            "is set from the target user's passwd entry and the secure path for privileged jobs; "
            "a request cannot set it"
        )
    if name in DANGEROUS_NAMES or name.startswith(DANGEROUS_PREFIXES):
        return "changes what a program loads or runs; a request cannot set it for a privileged job"
    if value is None:
        return None
    if name == "TZ":
        if tz_is_sane(value):
            return None
        return (
            f"must name a time zone (like Europe/Berlin), not a path outside {ZONEINFO}, "
            "a '..' element or unprintable text, for a privileged job"
        )
    if (name in CHECKED_NAMES or name.startswith(CHECKED_PREFIXES)) and ("/" in value or "%" in value):
        return "may not hold '/' or '%' for a privileged job (a path or a format)"
    return None


def tz_is_sane(value: str) -> bool:
    """sudo's ``tz_is_sane``: no path outside the zoneinfo directory, no ``..``, printable, bounded."""
    text = value[1:] if value.startswith(":") else value  # tzcode reads ":..." as a path
    if text.startswith("/") and not text.startswith(ZONEINFO + "/"):
        return False
    if len(text) >= PATH_MAX:
        return False
    if any(not c.isprintable() or c.isspace() or not c.isascii() for c in text):
        return False
    return ".." not in text.split("/")


def wildcard_refusal(pattern: str) -> str | None:
    """Why an ``env.allow`` wildcard (``NAME*``) may not be used, or None: it admits a denied name."""
    if not pattern.endswith("*"):
        return None
    prefix = pattern[:-1]
    names = sorted(n for n in (*RESET_NAMES, *DANGEROUS_NAMES) if n.startswith(prefix))
    names += sorted(f"{p}*" for p in DANGEROUS_PREFIXES if p.startswith(prefix) or prefix.startswith(p))
    if not names:
        return None
    shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
    return f"{pattern!r} admits names a privileged job may never set ({shown}); list the exact names you need instead"
