#!/usr/bin/env python3
"""Two Syncthing instances on this machine that keep two folders in step, for the sync tests
(Tests/IntegrationTests/SyncthingTests.swift): 127.0.0.1 only, with global and local discovery,
relays, NAT traversal, usage reporting, crash reporting and upgrade checks all off; each device
knows the other at its static 127.0.0.1 address.

    syncthing_pair.py ROOT FOLDER_A FOLDER_B

writes ROOT/a and ROOT/b (Syncthing homes) and prints one JSON line: the commands' homes, GUI
addresses and API key. The caller starts `syncthing serve --home=ROOT/a --no-browser --no-restart
--no-upgrade` (and b) and stops them.
"""
import json, os, socket, subprocess, sys
import xml.etree.ElementTree as ET

FOLDER_ID = "keychaind-sync"
API_KEY = "keychaind-test-api-key"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def generate(home):
    subprocess.run(["syncthing", "generate", "--home=" + home, "--no-default-folder", "--skip-port-probing"],
                   check=True, capture_output=True)
    out = subprocess.run(["syncthing", "serve", "--home=" + home, "--device-id"], check=True, capture_output=True,
                         text=True).stdout.strip()
    return out


def set_text(parent, tag, text):
    e = parent.find(tag)
    if e is None:
        e = ET.SubElement(parent, tag)
    e.text = text


def configure(home, me, other, listen, other_listen, gui, folder):
    path = os.path.join(home, "config.xml")
    tree = ET.parse(path)
    root = tree.getroot()
    o = root.find("options")
    set_text(o, "listenAddress", "tcp://127.0.0.1:%d" % listen)
    for tag, value in [("globalAnnounceEnabled", "false"), ("localAnnounceEnabled", "false"),
                       ("relaysEnabled", "false"), ("natEnabled", "false"), ("urAccepted", "-1"),
                       ("autoUpgradeIntervalH", "0"), ("startBrowser", "false"), ("crashReportingEnabled", "false"),
                       ("announceLANAddresses", "false"), ("reconnectionIntervalS", "1"),
                       ("setLowPriority", "false")]:
        set_text(o, tag, value)
    g = root.find("gui")
    set_text(g, "address", "127.0.0.1:%d" % gui)
    set_text(g, "apikey", API_KEY)
    d = ET.SubElement(root, "device", {"id": other, "name": "peer", "compression": "metadata",
                                      "introducer": "false", "skipIntroductionRemovals": "false",
                                      "introducedBy": ""})
    set_text(d, "address", "tcp://127.0.0.1:%d" % other_listen)
    set_text(d, "paused", "false")
    set_text(d, "autoAcceptFolders", "false")
    f = ET.Element("folder", {"id": FOLDER_ID, "label": FOLDER_ID, "path": folder, "type": "sendreceive",
                              "rescanIntervalS": "60", "fsWatcherEnabled": "true", "fsWatcherDelayS": "1",
                              "ignorePerms": "false", "autoNormalize": "true"})
    for dev in (me, other):
        ET.SubElement(f, "device", {"id": dev, "introducedBy": ""})
    set_text(f, "markerName", ".stfolder")
    root.insert(0, f)
    tree.write(path)


def main():
    root, folder_a, folder_b = sys.argv[1:4]
    homes = [os.path.join(root, "a"), os.path.join(root, "b")]
    ids = [generate(h) for h in homes]
    listen = [free_port(), free_port()]
    gui = [free_port(), free_port()]
    folders = [folder_a, folder_b]
    for i in (0, 1):
        os.makedirs(os.path.join(folders[i], ".stfolder"), exist_ok=True)
        with open(os.path.join(folders[i], ".stignore"), "w") as f:
            f.write("// keychaind's files being written (renamed into place when complete)\n.*.tmp\n")
        configure(homes[i], ids[i], ids[1 - i], listen[i], listen[1 - i], gui[i], folders[i])
    print(json.dumps({"homes": homes, "gui": ["127.0.0.1:%d" % p for p in gui], "apikey": API_KEY, "ids": ids}))


if __name__ == "__main__":
    main()
