#!/usr/bin/python3
"""A pinentry for tests: speaks the Assuan side of pinentry on stdin/stdout, as keychaind's libassuan
expects it, with no window.

Copied into a test's directory (as the config's pinentryProgram); beside itself it reads
`answers.json`, a list consumed one GETPIN at a time — {"pin": "..."} answers with that passphrase,
"cancel" with pinentry's cancel error (GPG_ERR_CANCELED, 83886179), "timeout" with its timeout error
(GPG_ERR_TIMEOUT, 83886142), {"hold": PATH} shows the dialog until PATH exists, then cancels; a
CONFIRM (yes/no dialog) takes the next answer too: "yes" is OK, "no" pinentry's not-confirmed error
(GPG_ERR_NOT_CONFIRMED, 83886194), "cancel" and "timeout" as above — and appends every command it gets (never a pin: it sends them) to
`pinentry.log`, one per line, with `DISPLAY=` / `WAYLAND_DISPLAY=` of its environment first.
"""
import json
import os
import sys
import time

here = os.path.dirname(os.path.abspath(sys.argv[0]))
answers_path = os.path.join(here, "answers.json")
state_path = os.path.join(here, "answers.used")


def log(line):
    with open(os.path.join(here, "pinentry.log"), "a") as f:
        f.write(line + "\n")


def next_answer():
    answers = json.load(open(answers_path)) if os.path.exists(answers_path) else []
    used = int(open(state_path).read()) if os.path.exists(state_path) else 0
    with open(state_path, "w") as f:
        f.write(str(used + 1))
    return answers[used] if used < len(answers) else "cancel"


def escape(text):
    return "".join(c if c not in "%\r\n" else "%%%02X" % ord(c) for c in text)


def send(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


log("START DISPLAY=%s WAYLAND_DISPLAY=%s" % (os.environ.get("DISPLAY", ""), os.environ.get("WAYLAND_DISPLAY", "")))
send("OK Pleased to meet you")
for raw in sys.stdin:
    line = raw.rstrip("\n")
    log(line)
    command = line.split(" ", 1)[0].upper()
    if command == "GETPIN":
        answer = next_answer()
        if answer == "cancel":
            send("ERR 83886179 Operation cancelled <Pinentry>")
        elif isinstance(answer, dict) and "hold" in answer:
            log("HOLDING")
            while not os.path.exists(answer["hold"]):
                time.sleep(0.05)      # a person who has not answered yet
            send("ERR 83886179 Operation cancelled <Pinentry>")
        elif answer == "timeout":
            send("ERR 83886142 Timeout <Pinentry>")
        else:
            send("D " + escape(answer["pin"]))
            send("OK")
    elif command == "CONFIRM":
        answer = next_answer()
        if answer == "yes":
            send("OK")
        elif answer == "no":
            send("ERR 83886194 Not confirmed <Pinentry>")
        elif answer == "timeout":
            send("ERR 83886142 Timeout <Pinentry>")
        else:
            send("ERR 83886179 Operation cancelled <Pinentry>")
    elif command == "BYE":
        send("OK closing connection")
        break
    else:
        send("OK")
