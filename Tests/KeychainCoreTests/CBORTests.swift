import KeychainCore
import KeychainSystem
import Testing

@Suite("CBOR codec")
struct CBORTests {
    func hex(_ s: String) -> [UInt8] {
        var out: [UInt8] = []
        var it = s.filter { $0 != " " }.makeIterator()
        while let a = it.next(), let b = it.next() { out.append(UInt8(String([a, b]), radix: 16)!) }
        return out
    }

    @Test("isText accepts exactly the text strings text(_:) reads")
    func isTextAgreesWithText() {
        var samples: [[UInt8]] = [
            [], Array("a".utf8), Array("exactly8".utf8), Array("ünïcödé and more than eight bytes".utf8),
            Array("😀".utf8), [0xFF], [0x61, 0xC3], [0xC3, 0x28], [0xED, 0xA0, 0x80], [0xF4, 0x90, 0x80, 0x80],
            Array("ascii then".utf8) + [0x80], [0xC0, 0xAF], Array(repeating: 0x7F, count: 17),
        ]
        var rng = SystemRandomNumberGenerator()
        for length in 0..<40 {
            // Mostly ASCII, some high bytes: valid and invalid sequences both.
            samples.append(
                (0..<length).map { _ in
                    UInt8.random(in: 0...9, using: &rng) == 0 ? .random(in: 0x80...0xFF) : .random(in: 0...0x7F)
                })
        }
        for sample in samples {
            sample.withUnsafeBytes { b in
                #expect(CBOR.isText(b) == (CBOR.text(b) != nil), "\(sample)")
            }
        }
    }

    @Test("RFC 8949 appendix A vectors decode to the right values")
    func rfcVectors() throws {
        #expect(try CBOR.decode(hex("00")) == .int(0))
        #expect(try CBOR.decode(hex("17")) == .int(23))
        #expect(try CBOR.decode(hex("1818")) == .int(24))
        #expect(try CBOR.decode(hex("1903e8")) == .int(1000))
        #expect(try CBOR.decode(hex("1a000f4240")) == .int(1_000_000))
        #expect(try CBOR.decode(hex("1b000000e8d4a51000")) == .int(1_000_000_000_000))
        #expect(try CBOR.decode(hex("20")) == .int(-1))
        #expect(try CBOR.decode(hex("3903e7")) == .int(-1000))
        #expect(try CBOR.decode(hex("f90000")) == .float(0))
        #expect(try CBOR.decode(hex("f93c00")) == .float(1))
        #expect(try CBOR.decode(hex("f97bff")) == .float(65504))
        #expect(try CBOR.decode(hex("fa47c35000")) == .float(100000))
        #expect(try CBOR.decode(hex("fb3ff199999999999a")) == .float(1.1))
        #expect(try CBOR.decode(hex("f4")) == .bool(false))
        #expect(try CBOR.decode(hex("f5")) == .bool(true))
        #expect(try CBOR.decode(hex("f6")) == .null)
        #expect(try CBOR.decode(hex("c11a514b67b0")) == .date(1_363_896_240))
        #expect(try CBOR.decode(hex("c1fb41d452d9ec200000")) == .date(1_363_896_240.5))
        #expect(try CBOR.decode(hex("4401020304")) == .bytes([1, 2, 3, 4]))
        #expect(try CBOR.decode(hex("6449455446")) == .text("IETF"))
        #expect(try CBOR.decode(hex("62c3bc")) == .text("ü"))
        #expect(try CBOR.decode(hex("83010203")) == .array([.int(1), .int(2), .int(3)]))
        #expect(try CBOR.decode(hex("a26161016162820203")) == .map(["a": .int(1), "b": .array([.int(2), .int(3)])]))
    }

    @Test("every value round-trips through encode and decode")
    func roundTrip() throws {
        let value: Value = .map([
            "v": .int(1), "id": .int(Int64.max), "neg": .int(Int64.min), "op": .text("copy"),
            "query": .map([
                "svce": .text("com.example ✓"), "v_Data": .bytes(Array(0...255)),
                "sync": .bool(true), "cdat": .date(1_700_000_000.25), "n": .null,
                "list": .array([.float(-2.5), .date(5)]),
            ]),
        ])
        #expect(try CBOR.decode(CBOR.encode(value)) == value)
    }

    @Test("encoding is deterministic: map keys shorter first, then bytewise")
    func deterministicOrder() {
        let bytes = CBOR.encode(.map(["op": .int(1), "v": .int(2), "id": .int(3)]))
        #expect(bytes == hex("a3 61 76 02 62 69 64 03 62 6f 70 01"))
    }

    @Test("indefinite lengths are refused")
    func indefiniteRefused() {
        #expect(throws: KeychainError.self) { try CBOR.decode(hex("5f42010243030405ff")) }
        #expect(throws: KeychainError.self) { try CBOR.decode(hex("bf6161 01 ff")) }
    }

    @Test("duplicate map keys are refused")
    func duplicateKeys() {
        #expect(throws: KeychainError.self) { try CBOR.decode(hex("a2 6161 01 6161 02")) }
    }

    @Test("non-text map keys are refused")
    func nonTextKeys() {
        #expect(throws: KeychainError.self) { try CBOR.decode(hex("a1 01 02")) }
    }

    @Test("truncated input, trailing bytes and oversized lengths are refused")
    func malformed() {
        #expect(throws: KeychainError.self) { try CBOR.decode([]) }
        #expect(throws: KeychainError.self) { try CBOR.decode(hex("1a0000")) }
        #expect(throws: KeychainError.self) { try CBOR.decode(hex("00 00")) }
        #expect(throws: KeychainError.self) { try CBOR.decode(hex("5b ffffffffffffffff 00")) }
        #expect(throws: KeychainError.self) { try CBOR.decode(hex("9b ffffffffffffffff")) }
        #expect(throws: KeychainError.self) { try CBOR.decode(hex("62 c3 28")) }  // invalid UTF-8
        #expect(throws: KeychainError.self) { try CBOR.decode(hex("1bffffffffffffffff")) }  // > Int64.max
        #expect(throws: KeychainError.self) { try CBOR.decode(hex("c2 41 00")) }  // tag 2
        #expect(throws: KeychainError.self) { try CBOR.decode(hex("f7")) }  // undefined
    }

    @Test("nesting deeper than the limit is refused, not a stack overflow")
    func depthLimit() {
        let deep = [UInt8](repeating: 0x81, count: 100_000) + [0x00]
        #expect(throws: KeychainError.self) { try CBOR.decode(deep) }
        let ok = [UInt8](repeating: 0x81, count: 16) + [0x00]
        #expect((try? CBOR.decode(ok)) != nil)
    }

    @Test("decode errors and descriptions never show byte or text contents")
    func noContentsInMessages() {
        let secret = "hunter2-secret"
        #expect(!Value.text(secret).description.contains(secret))
        #expect(!Value.bytes(Array(secret.utf8)).description.contains("104"))
        // Nor do reflection's printers (`dump`, a debugger's, a test framework's): no children.
        for value: Value in [
            .text(secret), .bytes(Array(secret.utf8)), .secret(SecretBytes(Array(secret.utf8))),
            .map(["v_Data": .bytes(Array(secret.utf8))]), .array([.text(secret)]),
        ] {
            var dumped = ""
            dump(value, to: &dumped)
            #expect(!dumped.contains(secret) && !dumped.contains("104"), "\(dumped)")
        }
        var bytes = CBOR.encode(.map(["k": .text(secret)]))
        bytes.append(0)
        do {
            _ = try CBOR.decode(bytes)
            Issue.record("trailing byte accepted")
        } catch {
            #expect(!error.message.contains(secret))
        }
    }
}
