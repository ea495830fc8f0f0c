import KeychainCore
import KeychainItems
import KeychainSystem

/// `org.freedesktop.DBus.Properties` on the Secret Service's objects.
extension SecretService {
    func properties(
        _ m: BusMessage, _ member: String, _ object: Object, _ known: BusCaller,
        _ caller: Caller
    ) throws(BusError) -> BusMessage {
        switch member {
        case "Get":
            try m.expect("ss")
            let interface = try m.readString()
            let name = try m.readString()
            try checkInterface(interface, object)
            let reply = try bus.newReturn(to: m)
            let values = try propertyValues(object, known, caller, only: name)
            guard let value = values.first else {
                throw BusError(
                    "org.freedesktop.DBus.Error.UnknownProperty",
                    "no property \(BusPath.printable(name)) in \(object.interface)")
            }
            try append(value.value, to: reply)
            return reply
        case "GetAll":
            try m.expect("s")
            let interface = try m.readString()
            try checkInterface(interface, object)
            let reply = try bus.newReturn(to: m)
            try reply.open("a", "{sv}")
            for (name, value) in try propertyValues(object, known, caller, only: nil) {
                try reply.open("e", "sv")
                try reply.append(string: name)
                try append(value, to: reply)
                try reply.close()
            }
            try reply.close()
            return reply
        case "Set":
            try m.expect("ssv")
            let interface = try m.readString()
            let name = try m.readString()
            try checkInterface(interface, object)
            guard let (_, contents) = try m.peek() else { throw .invalidArgs("missing value") }
            try set(m, name, contents ?? "", object, known, caller)
            return try bus.newReturn(to: m)
        default:
            throw .unknownMethod(Self.propertiesInterface, member)
        }
    }

    private func checkInterface(_ interface: String, _ object: Object) throws(BusError) {
        guard interface.isEmpty || interface == object.interface else {
            throw BusError(
                "org.freedesktop.DBus.Error.UnknownInterface",
                "this object has no interface \(BusPath.printable(interface))")
        }
    }

    enum PropertyValue {
        case string(String)
        case bool(Bool)
        case uint64(UInt64)
        case paths([String])
        case attributes(SecretServiceAttributes)
    }

    private func append(_ value: PropertyValue, to reply: BusMessage) throws(BusError) {
        switch value {
        case .string(let s):
            try reply.open("v", "s")
            try reply.append(string: s)
        case .bool(let b):
            try reply.open("v", "b")
            try reply.append(bool: b)
        case .uint64(let t):
            try reply.open("v", "t")
            try reply.append(uint64: t)
        case .paths(let p):
            try reply.open("v", "ao")
            try reply.append(objectPaths: p)
        case .attributes(let a):
            try reply.open("v", "a{ss}")
            try reply.append(stringMap: a.sorted)
        }
        try reply.close()
    }

    /// The properties of `object` (only `only`, when given), in the spec's order.
    private func propertyValues(
        _ object: Object, _ known: BusCaller, _ caller: Caller,
        only: String?
    ) throws(BusError) -> [(name: String, value: PropertyValue)] {
        func wanted(_ name: String) -> Bool { only == nil || only == name }
        var out: [(name: String, value: PropertyValue)] = []
        switch object {
        case .service:
            if wanted("Collections") { out.append(("Collections", .paths(known.collections.map(\.path)))) }
        case .collection(let c):
            try allow(.copy, known, caller)
            if wanted("Items") {
                let ids = try store { () throws(KeychainError) in
                    try items.secretServiceItemIDs(group: c.group, caller: caller)
                }
                out.append(("Items", .paths(ids.map(c.itemPath))))
            }
            if wanted("Label") { out.append(("Label", .string(c.group))) }
            if wanted("Locked") { out.append(("Locked", .bool(!items.secretServiceUnlocked))) }
            if wanted("Created") || wanted("Modified") {
                let dates = try store { () throws(KeychainError) in
                    try items.secretServiceGroupDates(group: c.group, caller: caller)
                }
                if wanted("Created") { out.append(("Created", .uint64(UInt64(max(0, dates.created))))) }
                if wanted("Modified") { out.append(("Modified", .uint64(UInt64(max(0, dates.modified))))) }
            }
        case .item(let c, let id):
            try allow(.copy, known, caller)
            guard
                let item = try store({ () throws(KeychainError) in
                    try items.secretServiceItem(id: id, groups: [c.group], caller: caller)
                })
            else {
                throw .unknownObject(c.itemPath(id))
            }
            counted(known)
            if wanted("Locked") { out.append(("Locked", .bool(item.locked))) }
            if wanted("Attributes") { out.append(("Attributes", .attributes(item.attributes))) }
            if wanted("Label") { out.append(("Label", .string(item.label))) }
            if wanted("Created") { out.append(("Created", .uint64(UInt64(max(0, item.created))))) }
            if wanted("Modified") { out.append(("Modified", .uint64(UInt64(max(0, item.modified))))) }
        case .foreignItem(let path, let id):
            let item = try foreignProperties(known, caller, path, id)
            if wanted("Locked") { out.append(("Locked", .bool(item.locked))) }
            if wanted("Attributes") { out.append(("Attributes", .attributes(item.attributes))) }
            if wanted("Label") { out.append(("Label", .string(item.label))) }
            if wanted("Created") { out.append(("Created", .uint64(UInt64(max(0, item.created))))) }
            if wanted("Modified") { out.append(("Modified", .uint64(UInt64(max(0, item.modified))))) }
        case .session, .prompt:
            break
        }
        return out
    }

    private func set(
        _ m: BusMessage, _ name: String, _ contents: String, _ object: Object, _ known: BusCaller,
        _ caller: Caller
    ) throws(BusError) {
        switch (object, name) {
        case (.item(let c, let id), "Label"):
            guard contents == "s" else { throw .invalidArgs("Label must be a string") }
            _ = try m.enter("v", "s")
            let label = try m.readString()
            try m.exit()
            try checkLabel(label)
            try allow(.update, known, caller)
            guard
                try store({ () throws(KeychainError) in
                    try items.secretServiceSetLabel(id: id, groups: [c.group], label: label, caller: caller)
                })
            else {
                throw .unknownObject(c.itemPath(id))
            }
            counted(known)
            emit("ItemChanged", group: c.group, id: id)
        case (.item(let c, let id), "Attributes"):
            guard contents == "a{ss}" else { throw .invalidArgs("Attributes must be a{ss}") }
            _ = try m.enter("v", "a{ss}")
            let attributes = try Self.attributes(m.readStringMap(limit: SecretServiceAttributes.maxCount))
            try m.exit()
            try allow(.update, known, caller)
            guard
                try store({ () throws(KeychainError) in
                    try items.secretServiceSetAttributes(
                        id: id, groups: [c.group], attributes: attributes, caller: caller)
                })
            else { throw .unknownObject(c.itemPath(id)) }
            counted(known)
            emit("ItemChanged", group: c.group, id: id)
        case (.foreignItem, _):
            throw Self.foreignReadOnly
        case (.collection, "Label"):
            throw BusError(
                "org.freedesktop.DBus.Error.PropertyReadOnly", "a collection's label is its access group's name")
        default:
            throw BusError(
                "org.freedesktop.DBus.Error.PropertyReadOnly", "property \(BusPath.printable(name)) cannot be set here")
        }
    }
}
