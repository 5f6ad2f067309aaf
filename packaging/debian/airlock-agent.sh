# /etc/profile.d/airlock-agent.sh (issue 48): agent accounts type `sudo` and reach airlock.
# Members of the agent group (airlock) get /usr/lib/airlock/agent-bin first on their PATH, where
# `sudo` and `sudoedit` turn sudo's command line into an airlock request.  Never root, never an
# operator (airlock-admin): people keep the real sudo.  A service that runs an agent sets PATH in
# its unit instead (docs/agents.md has the drop-in).
if [ "$(id -u 2>/dev/null)" != 0 ]; then
  case " $(id -Gn 2>/dev/null) " in
    *" airlock-admin "*) ;;
    *" airlock "*)
      case ":${PATH}:" in
        *:/usr/lib/airlock/agent-bin:*) ;;
        *) PATH="/usr/lib/airlock/agent-bin${PATH:+:$PATH}"; export PATH ;;
      esac
      ;;
  esac
fi
