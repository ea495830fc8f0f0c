"""Apple's Keychain Services constants with keychaind's wire values (docs/protocol.md §7, §8, §12).

Keys and values alike are the short strings Apple uses on the wire, so code reads like SecItem code::

    client.add({kSecClass: kSecClassGenericPassword, kSecAttrService: "svc",
                kSecAttrAccount: "alice", kSecValueData: b"s3cret"})
"""

# Class
kSecClass = "class"
kSecClassGenericPassword = "genp"
kSecClassInternetPassword = "inet"

# Attributes (protocol.md §7)
kSecAttrService = "svce"
kSecAttrAccount = "acct"
kSecAttrAccessGroup = "agrp"
kSecAttrAccessible = "pdmn"
kSecAttrLabel = "labl"
kSecAttrDescription = "desc"
kSecAttrComment = "icmt"
kSecAttrGeneric = "gena"
kSecAttrCreator = "crtr"
kSecAttrType = "type"
kSecAttrIsInvisible = "invi"
kSecAttrIsNegative = "nega"
kSecAttrSynchronizable = "sync"
kSecAttrSynchronizableAny = "syna"
kSecAttrCreationDate = "cdat"
kSecAttrModificationDate = "mdat"

# Attributes of an internet password (besides kSecAttrAccount and the common ones; protocol.md §7)
kSecAttrServer = "srvr"
kSecAttrProtocol = "ptcl"
kSecAttrAuthenticationType = "atyp"
kSecAttrPort = "port"
kSecAttrPath = "path"
kSecAttrSecurityDomain = "sdmn"

# Protocol values (kSecAttrProtocol): Apple's four-letter codes, some padded with a space
kSecAttrProtocolFTP = "ftp "
kSecAttrProtocolFTPAccount = "ftpa"
kSecAttrProtocolHTTP = "http"
kSecAttrProtocolIRC = "irc "
kSecAttrProtocolNNTP = "nntp"
kSecAttrProtocolPOP3 = "pop3"
kSecAttrProtocolSMTP = "smtp"
kSecAttrProtocolSOCKS = "sox "
kSecAttrProtocolIMAP = "imap"
kSecAttrProtocolLDAP = "ldap"
kSecAttrProtocolAppleTalk = "atlk"
kSecAttrProtocolAFP = "afp "
kSecAttrProtocolTelnet = "teln"
kSecAttrProtocolSSH = "ssh "
kSecAttrProtocolFTPS = "ftps"
kSecAttrProtocolHTTPS = "htps"
kSecAttrProtocolHTTPProxy = "htpx"
kSecAttrProtocolHTTPSProxy = "htsx"
kSecAttrProtocolFTPProxy = "ftpx"
kSecAttrProtocolSMB = "smb "
kSecAttrProtocolRTSP = "rtsp"
kSecAttrProtocolRTSPProxy = "rtsx"
kSecAttrProtocolDAAP = "daap"
kSecAttrProtocolEPPC = "eppc"
kSecAttrProtocolIPP = "ipp "
kSecAttrProtocolNNTPS = "ntps"
kSecAttrProtocolLDAPS = "ldps"
kSecAttrProtocolTelnetS = "tels"
kSecAttrProtocolIMAPS = "imps"
kSecAttrProtocolIRCS = "ircs"
kSecAttrProtocolPOP3S = "pops"

# Authentication type values (kSecAttrAuthenticationType)
kSecAttrAuthenticationTypeNTLM = "ntlm"
kSecAttrAuthenticationTypeMSN = "msna"
kSecAttrAuthenticationTypeDPA = "dpaa"
kSecAttrAuthenticationTypeRPA = "rpaa"
kSecAttrAuthenticationTypeHTTPBasic = "http"
kSecAttrAuthenticationTypeHTTPDigest = "httd"
kSecAttrAuthenticationTypeHTMLForm = "form"
kSecAttrAuthenticationTypeDefault = "dflt"

# Accessibility values (kSecAttrAccessible)
kSecAttrAccessibleWhenUnlocked = "ak"
kSecAttrAccessibleAfterFirstUnlock = "ck"
kSecAttrAccessibleAlways = "dk"
kSecAttrAccessibleWhenPasscodeSetThisDeviceOnly = "akpu"
kSecAttrAccessibleWhenUnlockedThisDeviceOnly = "aku"
kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly = "cku"
kSecAttrAccessibleAlwaysThisDeviceOnly = "dku"

# Access control (protocol.md §7.2): kSecAttrAccessControl's value is a dict,
# {"flags": SecAccessControlCreateFlags, "pdmn": an accessibility value (optional)};
# SecAccessControlCreateWithFlags(protection, flags) builds one.
kSecAttrAccessControl = "accc"
kSecAccessControlUserPresence = 1 << 0
kSecAccessControlDevicePasscode = 1 << 4
kSecAccessControlOr = 1 << 14
kSecAccessControlAnd = 1 << 15


def SecAccessControlCreateWithFlags(protection, flags):
    """An access-control value as keychaind takes it: reading the item's data asks the person
    (.userPresence, .devicePasscode; other flags are errSecUnimplemented)."""
    control = {"flags": int(flags)}
    if protection is not None:
        control["pdmn"] = protection
    return control


# Authentication UI (protocol.md §7): whether keychaind may ask the person
kSecUseAuthenticationUI = "u_AuthUI"
kSecUseAuthenticationUIAllow = "u_AuthUIA"
kSecUseAuthenticationUIFail = "u_AuthUIF"
kSecUseAuthenticationUISkip = "u_AuthUIS"
kSecUseNoAuthenticationUI = "u_NoAuthUI"

# Values
kSecValueData = "v_Data"
kSecValuePersistentRef = "v_PersistentRef"

# Match (protocol.md §8)
kSecMatchLimit = "m_Limit"
kSecMatchLimitOne = "m_LimitOne"
kSecMatchLimitAll = "m_LimitAll"
kSecMatchCaseInsensitive = "m_CaseInsensitive"

# Return
kSecReturnData = "r_Data"
kSecReturnAttributes = "r_Attributes"
kSecReturnPersistentRef = "r_PersistentRef"

kCFBooleanTrue = True
kCFBooleanFalse = False

# OSStatus codes (protocol.md §12)
noErr = 0
errSecSuccess = 0
errSecUnimplemented = -4
errSecIO = -36
errSecUserCanceled = -128
errSecParam = -50
errSecAllocate = -108
errSecNotAvailable = -25291
errSecReadOnly = -25292
errSecAuthFailed = -25293
errSecDuplicateItem = -25299
errSecItemNotFound = -25300
errSecNoSuchAttr = -25303
errSecNoSuchClass = -25306
errSecInteractionNotAllowed = -25308
errSecDecode = -26275
errSecInternal = -26276
errSecMissingEntitlement = -34018

STATUS_NAMES = {
    0: "errSecSuccess",
    -4: "errSecUnimplemented",
    -36: "errSecIO",
    -128: "errSecUserCanceled",
    -50: "errSecParam",
    -108: "errSecAllocate",
    -25291: "errSecNotAvailable",
    -25292: "errSecReadOnly",
    -25293: "errSecAuthFailed",
    -25299: "errSecDuplicateItem",
    -25300: "errSecItemNotFound",
    -25303: "errSecNoSuchAttr",
    -25306: "errSecNoSuchClass",
    -25308: "errSecInteractionNotAllowed",
    -26275: "errSecDecode",
    -26276: "errSecInternal",
    -34018: "errSecMissingEntitlement",
}

STATUS_MESSAGES = {
    0: "No error.",
    -4: "Function or operation not implemented.",
    -36: "I/O error.",
    -128: "User canceled the operation.",
    -50: "One or more parameters passed to a function were not valid.",
    -108: "Failed to allocate memory.",
    -25291: "No keychain is available.",
    -25292: "This keychain cannot be modified.",
    -25293: "The user name or passphrase you entered is not correct.",
    -25299: "The specified item already exists in the keychain.",
    -25300: "The specified item could not be found in the keychain.",
    -25303: "The specified attribute does not exist.",
    -25306: "The specified item class does not exist.",
    -25308: "User interaction is not allowed (the keychain is locked).",
    -26275: "Unable to decode the provided data.",
    -26276: "An internal error occurred.",
    -34018: "A required entitlement isn't present.",
}


def status_name(status: int) -> str:
    """Apple's symbolic name of an OSStatus (``errSecItemNotFound``), or ``OSStatus N``."""
    return STATUS_NAMES.get(status, f"OSStatus {status}")


def SecCopyErrorMessageString(status: int, reserved=None) -> str:
    """The generic one-line text for an OSStatus, as Apple's function of the same name."""
    return STATUS_MESSAGES.get(status, f"OSStatus {status}.")


__all__ = [name for name in dir() if name.startswith(("kSec", "kCF", "errSec"))] + [
    "noErr", "status_name", "SecCopyErrorMessageString", "STATUS_NAMES", "STATUS_MESSAGES",
    "SecAccessControlCreateWithFlags",
]
