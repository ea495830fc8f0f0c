# bash completion for keychainctl and keychaind.
# Installed as /usr/share/bash-completion/completions/keychainctl (keychaind: a link to it).
#
# Verbs and flags come from the tools' own --help, so they never drift from the binaries. Service,
# account and group names come from the daemon (`keychainctl list --json`): the names the caller
# may list, none when the keychain is locked or the daemon is not running.

# The flags of `keychainctl VERB --help` (or of `keychaind --help`), one per line.
_keychaind_flags() {
    "$@" --help 2>/dev/null | sed -n 's/^ *\(-[-A-Za-z]*\)\(, \(--[-A-Za-z]*\)\)\{0,1\}.*/\1\n\3/p' | sed '/^$/d'
}

# Tab-separated service, account and group of every item the caller can list (GROUP filters).
_keychainctl_items() {
    local -a args=(list --json)
    [ -n "$_keychainctl_socket" ] && args+=(--socket "$_keychainctl_socket")
    [ -n "$1" ] && args+=(-g "$1")
    timeout 3 "${_keychainctl_cmd:-keychainctl}" "${args[@]}" 2>/dev/null | awk '
        # A small reader for what `list --json` prints: one line, an array of flat objects.
        function flush() { if (svce != "" || acct != "" || agrp != "") print svce "\t" acct "\t" agrp; svce = acct = agrp = "" }
        {
            n = length($0); i = 1; key = ""; expect_key = 0
            while (i <= n) {
                c = substr($0, i, 1)
                if (c == "{" || c == ",") { expect_key = 1; i++; continue }
                if (c == "}") { flush(); i++; continue }
                if (c != "\"") { i++; continue }
                s = ""; i++
                while (i <= n && (c = substr($0, i, 1)) != "\"") {
                    if (c == "\\") {
                        e = substr($0, i + 1, 1)
                        if (e == "u") { s = s "?"; i += 6; continue }
                        s = s (e == "n" ? "\n" : e == "t" ? "\t" : e == "r" ? "\r" : e); i += 2; continue
                    }
                    s = s c; i++
                }
                i++
                if (expect_key) { key = s; expect_key = 0; continue }
                if (key == "svce") svce = s; else if (key == "acct") acct = s; else if (key == "agrp") agrp = s
            }
        }'
}

# Adds the lines of stdin that start with $cur to COMPREPLY, quoted for the shell (feed it with
# < <(...): at the end of a pipeline it would run in a subshell).
_keychaind_add_matching() {
    local line
    while IFS= read -r line; do
        [ -n "$line" ] && [[ $line == "$cur"* ]] && COMPREPLY+=("$(printf '%q' "$line")")
    done
}

_keychainctl() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
    local _keychainctl_cmd=${COMP_WORDS[0]} _keychainctl_socket="" verb="" service="" group=""
    local i w
    COMPREPLY=()
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=${COMP_WORDS[i]}
        case $w in
            --socket) _keychainctl_socket=${COMP_WORDS[i+1]}; ((i++)); continue ;;
            --socket=*) _keychainctl_socket=${w#--socket=}; continue ;;
            -s|--service) service=${COMP_WORDS[i+1]} ;;
            -g|--group|--access-group) group=${COMP_WORDS[i+1]} ;;
        esac
        if [ -z "$verb" ] && [[ $w != -* ]]; then
            case ${COMP_WORDS[i-1]} in
                -s|--service|--server|-a|--account|-g|--group|--access-group|-w|--secret|--accessible|-l|--label|-j|--comment|-D|--description|-r|--protocol|-P|--port|-p|--path|-d|--security-domain|-t|--auth-type|--passphrase-file|--new-passphrase-file|--passphrase-fd|--new-passphrase-fd) ;;
                *) verb=$w ;;
            esac
        fi
    done

    # The internet-password verbs take macOS security's flags: -s is the server, -g shows the password.
    case $verb in
        *-internet-password)
            case $prev in
                -r|--protocol)
                    COMPREPLY=($(compgen -W "htps http ftp ftps ssh imap imps smtp pop3 pops ldap ldps teln smb afp" -- "$cur")); return ;;
                -t|--auth-type)
                    COMPREPLY=($(compgen -W "form dflt http httd ntlm msna dpaa rpaa" -- "$cur")); return ;;
                -s|--server|-a|--account|-P|--port|-p|--path|-d|--security-domain) return ;;
                -g) prev="" ;;
            esac ;;
    esac

    case $prev in
        --socket|--passphrase-file|--new-passphrase-file)
            COMPREPLY=($(compgen -f -- "$cur")); compopt -o filenames 2>/dev/null; return ;;
        -s|--service)
            _keychaind_add_matching < <(_keychainctl_items "$group" | cut -f1 | sort -u); return ;;
        -a|--account)
            _keychaind_add_matching < <(_keychainctl_items "$group" | awk -F'\t' -v s="$service" 's == "" || $1 == s { print $2 }' | sort -u)
            return ;;
        -g|--group|--access-group)
            _keychaind_add_matching < <(_keychainctl_items "" | cut -f3 | sort -u); return ;;
        --accessible)
            COMPREPLY=($(compgen -W "ak ck dk akpu aku cku dku" -- "$cur")); return ;;
        -w|--secret)
            case $verb in find|find-internet-password) ;; *) return ;; esac ;;
        -l|--label|-j|--comment|-D|--description|--passphrase-fd|--new-passphrase-fd)
            return ;;
    esac

    if [ -z "$verb" ]; then
        if [[ $cur == -* ]]; then
            COMPREPLY=($(compgen -W "--json --socket --help" -- "$cur"))
        else
            COMPREPLY=($(compgen -W "$("$_keychainctl_cmd" --help 2>/dev/null | sed -n '/^verbs:/,/^$/s/^  \([a-z-]*\) .*/\1/p')" -- "$cur"))
        fi
        return
    fi
    case $verb in
        help)
            COMPREPLY=($(compgen -W "$("$_keychainctl_cmd" --help 2>/dev/null | sed -n '/^verbs:/,/^$/s/^  \([a-z-]*\) .*/\1/p')" -- "$cur"))
            return ;;
        backup|restore)
            if [[ $cur != -* ]]; then COMPREPLY=($(compgen -f -- "$cur")); compopt -o filenames 2>/dev/null; return; fi ;;
    esac
    COMPREPLY=($(compgen -W "$(_keychaind_flags "$_keychainctl_cmd" "$verb")" -- "$cur"))
}

_keychaind() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
    COMPREPLY=()
    case $prev in
        --socket|--config) COMPREPLY=($(compgen -f -- "$cur")); compopt -o filenames 2>/dev/null; return ;;
        --data-dir) COMPREPLY=($(compgen -d -- "$cur")); compopt -o filenames 2>/dev/null; return ;;
        --log-level) COMPREPLY=($(compgen -W "error warning notice info debug" -- "$cur")); return ;;
    esac
    COMPREPLY=($(compgen -W "$(_keychaind_flags "${COMP_WORDS[0]}")" -- "$cur"))
}

complete -F _keychainctl keychainctl
complete -F _keychaind keychaind
