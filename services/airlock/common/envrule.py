"""Which environment variables a request may never set for a root job (like sudo's env_reset).

A root job's HOME, USER, LOGNAME, SHELL and PATH come from root's passwd entry
and a fixed secure path, never from the request: a request naming one of
them is refused, never silently dropped.  The other names here change what a
program loads or runs (libraries, interpreter start-up code, config files,
helper commands); they follow sudo's ``env_delete`` list and glibc's
``UNSECURE_ENVVARS``, plus a few tools that run commands from the
environment.  docs/security.md lists them with the reasons.

Pure: intake (validation) and the runner (the re-check) both ask `refusal`.
"""

from __future__ import annotations

# Set from the target user's passwd entry and the secure path, never by a request.
RESET_NAMES = ("HOME", "LOGNAME", "PATH", "SHELL", "USER")

DANGEROUS_NAMES = frozenset(
    {
        # shells: start-up files, word splitting, prompts, functions
        "BASH_ENV",
        "ENV",
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
        # glibc's unsecure variables (ignored for setuid programs, not for root jobs)
        "GCONV_PATH",
        "GETCONF_DIR",
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
        # interpreters' start-up code
        "JAVA_TOOL_OPTIONS",
        "PERLIO_DEBUG",
        "PERLLIB",
        "RUBYLIB",
        "RUBYOPT",
        "NODE_OPTIONS",
        "NODE_PATH",
        # Kerberos and helpers that run a command named in the environment
        "KRB5_CONFIG",
        "KRB5_KTNAME",
        "PAGER",
        "EDITOR",
        "VISUAL",
        "BROWSER",
        "LESSOPEN",
        "LESSCLOSE",
        "MANPAGER",
        "SSH_ASKPASS",
        "SUDO_ASKPASS",
        "OPENSSL_CONF",
        "CURL_HOME",
        "WGETRC",
        "XDG_CONFIG_HOME",
    }
)
DANGEROUS_PREFIXES = ("LD_", "_RLD", "DYLD_", "MALLOC_", "PYTHON", "PERL5", "BASH_FUNC_", "GIT_")


def refusal(name: str) -> str | None:
    """Why a request may not set ``name`` for a root job, or None if it may."""
    if name in RESET_NAMES:
        return (
            "is set from the target user's passwd entry and the secure path for privileged jobs; "
            "a request cannot set it"
        )
    if name in DANGEROUS_NAMES or name.startswith(DANGEROUS_PREFIXES):
        return "changes what a program loads or runs; a request cannot set it for a privileged job"
    return None
