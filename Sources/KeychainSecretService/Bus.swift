import CSystemd
import KeychainSystem

/// A D-Bus error reply: the error name and a one-line message (never a secret or an attribute value).
struct BusError: Error, Sendable {
    let name: String
    let message: String

    init(_ name: String, _ message: String) {
        self.name = name
        self.message = message
    }

    static func invalidArgs(_ m: String) -> BusError { BusError("org.freedesktop.DBus.Error.InvalidArgs", m) }
    static func unknownObject(_ path: String) -> BusError {
        BusError("org.freedesktop.DBus.Error.UnknownObject", "no such object: \(BusPath.printable(path))")
    }
    static func unknownMethod(_ interface: String, _ member: String) -> BusError {
        BusError("org.freedesktop.DBus.Error.UnknownMethod", "no method \(member) in interface \(interface) here")
    }
    static func noSuchObject(_ m: String) -> BusError { BusError("org.freedesktop.Secret.Error.NoSuchObject", m) }
    static func noSession(_ m: String) -> BusError { BusError("org.freedesktop.Secret.Error.NoSession", m) }
    static func isLocked(_ m: String) -> BusError { BusError("org.freedesktop.Secret.Error.IsLocked", m) }
    static func accessDenied(_ m: String) -> BusError { BusError("org.freedesktop.DBus.Error.AccessDenied", m) }
    static func notSupported(_ m: String) -> BusError { BusError("org.freedesktop.DBus.Error.NotSupported", m) }
    static func failed(_ m: String) -> BusError { BusError("org.freedesktop.DBus.Error.Failed", m) }
    static func limitsExceeded(_ m: String) -> BusError { BusError("org.freedesktop.DBus.Error.LimitsExceeded", m) }
}

/// Object paths: printable for messages.
enum BusPath {
    static func printable(_ path: String) -> String {
        String(
            path.unicodeScalars.prefix(120).map {
                $0.isASCII && $0.value >= 0x20 && $0.value < 0x7F ? Character($0) : "?"
            })
    }
}

/// One sd-bus message, referenced for this object's life. Reading and appending go through the
/// typed, non-variadic sd-bus calls; every failure becomes a `BusError` (InvalidArgs when reading).
final class BusMessage {
    let raw: OpaquePointer

    /// Takes a new reference to `raw`.
    init(retaining raw: OpaquePointer) {
        self.raw = raw
        sd_bus_message_ref(raw)
    }

    /// Takes over the reference the caller holds.
    init(adopting raw: OpaquePointer) {
        self.raw = raw
    }

    deinit { sd_bus_message_unref(raw) }

    private static func string(_ p: UnsafePointer<CChar>?) -> String? { p.map { String(cString: $0) } }

    var path: String? { Self.string(sd_bus_message_get_path(raw)) }
    var interface: String? { Self.string(sd_bus_message_get_interface(raw)) }
    var member: String? { Self.string(sd_bus_message_get_member(raw)) }
    var sender: String? { Self.string(sd_bus_message_get_sender(raw)) }
    var destination: String? { Self.string(sd_bus_message_get_destination(raw)) }
    /// The complete body signature.
    var signature: String { Self.string(sd_bus_message_get_signature(raw, 1)) ?? "" }

    var isMethodCall: Bool {
        var type: UInt8 = 0
        return sd_bus_message_get_type(raw, &type) >= 0 && type == UInt8(SD_BUS_MESSAGE_METHOD_CALL)
    }

    /// Has sd-bus wipe the message's memory when it frees it; a reply made to a marked call is marked
    /// too. Secrets of `plain` sessions travel in the clear inside these buffers.
    func markSensitive() throws(BusError) {
        let r = sd_bus_message_sensitive(raw)
        if r < 0 { throw .failed("cannot mark a message sensitive (error \(-r))") }
    }

    var isSignal: Bool {
        var type: UInt8 = 0
        return sd_bus_message_get_type(raw, &type) >= 0 && type == UInt8(SD_BUS_MESSAGE_SIGNAL)
    }

    /// Checks the body's signature before anything is read: wrong types are InvalidArgs.
    func expect(_ signature: String) throws(BusError) {
        let actual = self.signature
        guard actual == signature else {
            throw .invalidArgs("expected arguments of type \"\(signature)\", got \"\(BusPath.printable(actual))\"")
        }
    }

    private func check(_ r: Int32, _ what: String) throws(BusError) {
        if r < 0 { throw .invalidArgs("cannot read \(what) (error \(-r))") }
    }

    private static func code(_ c: Character) -> CChar { CChar(bitPattern: c.asciiValue!) }

    // MARK: Reading

    /// A string, object path or signature (`s`, `o`, `g`), as UTF-8 bytes.
    func readStringBytes(_ type: Character = "s") throws(BusError) -> [UInt8] {
        var p: UnsafePointer<CChar>?
        try check(sd_bus_message_read_basic(raw, Self.code(type), &p), "a string")
        guard let p else { throw .invalidArgs("missing string") }
        return SystemLayer.bytes(ofCString: p)
    }

    func readString(_ type: Character = "s") throws(BusError) -> String {
        String(decoding: try readStringBytes(type), as: UTF8.self)
    }

    func readBool() throws(BusError) -> Bool {
        var b: Int32 = 0
        try check(sd_bus_message_read_basic(raw, Self.code("b"), &b), "a boolean")
        return b != 0
    }

    func readUInt32() throws(BusError) -> UInt32 {
        var v: UInt32 = 0
        try check(sd_bus_message_read_basic(raw, Self.code("u"), &v), "a uint32")
        return v
    }

    /// A unix fd (`h`): owned by the message, valid while it lives.
    func readFD() throws(BusError) -> Int32 {
        var fd: Int32 = -1
        try check(sd_bus_message_read_basic(raw, Self.code("h"), &fd), "a file descriptor")
        return fd
    }

    /// `ay`.
    func readBytes() throws(BusError) -> [UInt8] {
        var p: UnsafeRawPointer?
        var size = 0
        try check(sd_bus_message_read_array(raw, Self.code("y"), &p, &size), "a byte array")
        guard let p, size > 0 else { return [] }
        return Array(UnsafeRawBufferPointer(start: p, count: size))
    }

    func enter(_ type: Character, _ contents: String) throws(BusError) -> Bool {
        let r = sd_bus_message_enter_container(raw, Self.code(type), contents)
        try check(r, "a container")
        return r > 0
    }

    func exit() throws(BusError) {
        try check(sd_bus_message_exit_container(raw), "the end of a container")
    }

    /// The type of the next value (and a container's contents signature), or nil at the end.
    func peek() throws(BusError) -> (type: Character, contents: String?)? {
        var type: CChar = 0
        var contents: UnsafePointer<CChar>?
        let r = sd_bus_message_peek_type(raw, &type, &contents)
        try check(r, "a type")
        guard r > 0 else { return nil }
        return (Character(Unicode.Scalar(UInt8(bitPattern: type))), contents.map { String(cString: $0) })
    }

    func skip(_ types: String) throws(BusError) {
        try check(sd_bus_message_skip(raw, types), "past a value")
    }

    /// `ao`, at most `limit` paths (LimitsExceeded beyond, before more is read).
    func readObjectPaths(limit: Int) throws(BusError) -> [String] {
        _ = try enter("a", "o")
        var out: [String] = []
        while try peek() != nil {
            guard out.count < limit else {
                throw .limitsExceeded("too many object paths in one call (at most \(limit))")
            }
            out.append(try readString("o"))
        }
        try exit()
        return out
    }

    /// `a{ss}` as byte pairs, at most `limit` entries (InvalidArgs beyond: a huge map costs nothing).
    func readStringMap(limit: Int) throws(BusError) -> [(name: [UInt8], value: [UInt8])] {
        _ = try enter("a", "{ss}")
        var out: [(name: [UInt8], value: [UInt8])] = []
        while try enter("e", "ss") {
            out.append((try readStringBytes(), try readStringBytes()))
            try exit()
            if out.count > limit { throw .invalidArgs("too many attributes (at most \(limit))") }
        }
        try exit()
        return out
    }

    // MARK: Appending

    func append(string: String, type: Character = "s") throws(BusError) {
        let r = string.withCString { sd_bus_message_append_basic(raw, Self.code(type), $0) }
        if r < 0 { throw .failed("cannot build the reply (error \(-r))") }
    }

    func append(stringBytes bytes: [UInt8]) throws(BusError) {
        // A D-Bus string holds no NUL: attribute bytes came from the bus, so they hold none either.
        var z = bytes
        z.append(0)
        let r = z.withUnsafeBufferPointer { sd_bus_message_append_basic(raw, Self.code("s"), $0.baseAddress) }
        if r < 0 { throw .failed("cannot build the reply (error \(-r))") }
    }

    func append(bool: Bool) throws(BusError) {
        var b: Int32 = bool ? 1 : 0
        let r = sd_bus_message_append_basic(raw, Self.code("b"), &b)
        if r < 0 { throw .failed("cannot build the reply (error \(-r))") }
    }

    func append(uint32: UInt32) throws(BusError) {
        var v = uint32
        let r = sd_bus_message_append_basic(raw, Self.code("u"), &v)
        if r < 0 { throw .failed("cannot build the reply (error \(-r))") }
    }

    func append(uint64: UInt64) throws(BusError) {
        var v = uint64
        let r = sd_bus_message_append_basic(raw, Self.code("t"), &v)
        if r < 0 { throw .failed("cannot build the reply (error \(-r))") }
    }

    func append(bytes: [UInt8]) throws(BusError) {
        let r = bytes.withUnsafeBytes {
            sd_bus_message_append_array(
                raw, Self.code("y"), $0.baseAddress ?? UnsafeRawPointer(bitPattern: 1)!, $0.count)
        }
        if r < 0 { throw .failed("cannot build the reply (error \(-r))") }
    }

    func open(_ type: Character, _ contents: String) throws(BusError) {
        let r = sd_bus_message_open_container(raw, Self.code(type), contents)
        if r < 0 { throw .failed("cannot build the reply (error \(-r))") }
    }

    func close() throws(BusError) {
        let r = sd_bus_message_close_container(raw)
        if r < 0 { throw .failed("cannot build the reply (error \(-r))") }
    }

    func append(objectPaths: [String]) throws(BusError) {
        try open("a", "o")
        for p in objectPaths { try append(string: p, type: "o") }
        try close()
    }

    func append(stringMap pairs: [(name: [UInt8], value: [UInt8])]) throws(BusError) {
        try open("a", "{ss}")
        for (n, v) in pairs {
            try open("e", "ss")
            try append(stringBytes: n)
            try append(stringBytes: v)
            try close()
        }
        try close()
    }
}

/// A connection to the session bus (the Secret Service's) or the system bus (logind's; SessionLock),
/// used from one thread only.
final class BusConnection {
    let raw: OpaquePointer

    enum Kind { case session, system }

    /// Connects to the session bus (`$DBUS_SESSION_BUS_ADDRESS`), or to the system bus
    /// (`$DBUS_SYSTEM_BUS_ADDRESS`, else /run/dbus/system_bus_socket).
    init(_ kind: Kind = .session) throws(BusError) {
        var bus: OpaquePointer?
        let r = kind == .session ? sd_bus_open_user(&bus) : sd_bus_open_system(&bus)
        guard r >= 0, let bus else {
            switch kind {
            case .session:
                throw .failed(
                    "cannot connect to the session bus (\(BusConnection.describe(r))); is DBUS_SESSION_BUS_ADDRESS set? (dbus-user-session on a desktop, dbus-run-session elsewhere)"
                )
            case .system:
                throw .failed("cannot connect to the system bus (\(BusConnection.describe(r)))")
            }
        }
        raw = bus
    }

    deinit {
        _ = sd_bus_flush(raw)
        sd_bus_close(raw)
        sd_bus_unref(raw)
    }

    static func describe(_ r: Int32) -> String { SystemLayer.describe(errno: -r) }

    var uniqueName: String {
        var p: UnsafePointer<CChar>?
        return sd_bus_get_unique_name(raw, &p) >= 0 && p != nil ? String(cString: p!) : "?"
    }

    /// Requests a well-known name. Returns nil when owned, else errno (EEXIST: someone else holds it).
    func requestName(_ name: String, replace: Bool) -> Int32? {
        let r = sd_bus_request_name(raw, name, replace ? UInt64(SD_BUS_NAME_REPLACE_EXISTING) : 0)
        return r >= 0 ? nil : -r
    }

    /// A method call to `destination`, to be filled with `append…` and sent with `call`.
    func newCall(destination: String, path: String, interface: String, member: String) throws(BusError) -> BusMessage {
        var m: OpaquePointer?
        let r = sd_bus_message_new_method_call(raw, &m, destination, path, interface, member)
        guard r >= 0, let m else { throw .failed("cannot make a bus call (\(Self.describe(r)))") }
        return BusMessage(adopting: m)
    }

    /// Sends a call and waits for its reply (other incoming messages are queued meanwhile). An error
    /// reply becomes a `BusError` with its name.
    ///
    /// The reply must come from the call's destination. dbus-daemon (1.14, Debian 12's) delivers a
    /// method reply from any connection to whoever it names, and sd-bus matches replies by serial
    /// alone: a process of the user that guesses the next serial could answer keychaind's own
    /// `GetConnectionCredentials` with another process's pid and be identified as that app. The bus
    /// sets a reply's sender itself, so a reply from anyone else is refused here. (Every call
    /// keychaind makes goes to `org.freedesktop.DBus` or a unique name, which is what a reply's
    /// sender then is; a call to another well-known name would be answered by its owner's unique name.)
    func call(_ message: BusMessage, timeoutMicroseconds: UInt64 = 5_000_000) throws(BusError) -> BusMessage {
        var error = sd_bus_error()
        var reply: OpaquePointer?
        let r = sd_bus_call(raw, message.raw, timeoutMicroseconds, &error, &reply)
        defer { sd_bus_error_free(&error) }
        guard r >= 0, let reply else {
            let name = error.name.map { String(cString: $0) } ?? "org.freedesktop.DBus.Error.Failed"
            let text = error.message.map { String(cString: $0) } ?? Self.describe(r)
            throw BusError(name, text)
        }
        let answer = BusMessage(adopting: reply)
        guard let destination = message.destination, answer.sender == destination else {
            throw BusError(
                "org.freedesktop.DBus.Error.AccessDenied",
                "a reply to keychaind's call to \(message.destination ?? "?") came from \(answer.sender ?? "an unknown sender"); refused"
            )
        }
        return answer
    }

    func newReturn(to call: BusMessage) throws(BusError) -> BusMessage {
        var m: OpaquePointer?
        let r = sd_bus_message_new_method_return(call.raw, &m)
        guard r >= 0, let m else { throw .failed("cannot make a reply (\(Self.describe(r)))") }
        let reply = BusMessage(adopting: m)
        try reply.markSensitive()  // sd-bus copies the call's mark; said again so no reply depends on it
        return reply
    }

    func newSignal(path: String, interface: String, member: String) throws(BusError) -> BusMessage {
        var m: OpaquePointer?
        let r = sd_bus_message_new_signal(raw, &m, path, interface, member)
        guard r >= 0, let m else { throw .failed("cannot make a signal (\(Self.describe(r)))") }
        return BusMessage(adopting: m)
    }

    /// Queues a message; with `destination`, a signal goes to that connection only (unicast).
    @discardableResult
    func send(_ message: BusMessage, destination: String? = nil) -> Bool {
        if let destination, sd_bus_message_set_destination(message.raw, destination) < 0 { return false }
        return sd_bus_send(raw, message.raw, nil) >= 0
    }

    func replyError(to call: BusMessage, _ error: BusError) {
        error.name.withCString { name in
            error.message.withCString { text in
                var e = kc_bus_error(name, text)
                _ = sd_bus_reply_method_error(call.raw, &e)
            }
        }
    }

    /// Runs `handler` for every message to `prefix` and the paths below it.
    func addFallback(_ prefix: String, handler: sd_bus_message_handler_t, userdata: UnsafeMutableRawPointer)
        throws(BusError)
    {
        let r = sd_bus_add_fallback(raw, nil, prefix, handler, userdata)
        if r < 0 { throw .failed("cannot serve \(prefix) (\(Self.describe(r)))") }
    }

    func addMatch(_ rule: String, handler: sd_bus_message_handler_t, userdata: UnsafeMutableRawPointer) throws(BusError)
    {
        let r = sd_bus_add_match(raw, nil, rule, handler, userdata)
        if r < 0 { throw .failed("cannot subscribe to \(rule) (\(Self.describe(r)))") }
    }

    /// Dispatches one queued message; > 0 when there may be more, 0 when idle, < 0 on a lost bus.
    func process() -> Int32 { sd_bus_process(raw, nil) }

    func flush() { _ = sd_bus_flush(raw) }

    var fd: Int32 { sd_bus_get_fd(raw) }
    var events: Int32 { sd_bus_get_events(raw) }

    /// Milliseconds until sd-bus needs to run again (-1: no timeout pending).
    var timeoutMilliseconds: Int32 {
        var usec: UInt64 = 0
        guard sd_bus_get_timeout(raw, &usec) >= 0, usec != UInt64.max else { return -1 }
        let nowUsec = SystemLayer.monotonicMicroseconds()
        return usec <= nowUsec ? 0 : Int32(min((usec - nowUsec + 999) / 1000, 60_000))
    }
}
