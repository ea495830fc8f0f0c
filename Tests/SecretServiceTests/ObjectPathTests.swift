import Testing

@testable import KeychainSecretService

/// The Secret Service's object paths: collection path elements are valid D-Bus path elements,
/// distinct for distinct access groups, and item ids are read back only in the form they are written.
@Suite struct ObjectPathRules {
    @Test func collectionPathElementsAreSafeAndDistinct() {
        #expect(Collection.element(for: "ABCDE12345.com.example.app", first: true) == "login")
        #expect(
            Collection.element(for: "ABCDE12345.com.example.app", first: false) == "ABCDE12345_2ecom_2eexample_2eapp")
        #expect(Collection.element(for: "login", first: false) == "_6cogin")
        #expect(Collection.element(for: "a_b", first: false) == "a_5fb")
        #expect(Collection.element(for: "é", first: false) == "_c3_a9")
        #expect(SecretService.itemID(String(repeating: "0a", count: 16)) == [UInt8](repeating: 10, count: 16))
        #expect(SecretService.itemID(String(repeating: "0A", count: 16)) == nil)
        #expect(SecretService.itemID("00") == nil)
    }
}
