import KeychainSystem

/// A random-number generator, as Apple's `SecRandomRef`; Linux has one, the kernel's, named by
/// `kSecRandomDefault`, so no value of this type is ever made.
public final class SecRandom: Sendable {
    private init() {}
}
/// Apple's name for a reference to a generator.
public typealias SecRandomRef = SecRandom

/// The default generator (`nil`, as on Apple platforms): the kernel's CSPRNG (`getrandom(2)`).
public let kSecRandomDefault: SecRandomRef? = nil

// swift-format-ignore: AlwaysUseLowerCamelCase
/// Fills `bytes` with `count` cryptographically secure random bytes, as Apple's `SecRandomCopyBytes`:
/// `errSecSuccess`, `errSecParam` for a negative count, or `errSecIO` when the kernel gives none.
/// `rnd` is ignored (Apple accepts only `kSecRandomDefault` there too).
public func SecRandomCopyBytes(_ rnd: SecRandomRef?, _ count: Int, _ bytes: UnsafeMutableRawPointer) -> Int32 {
    guard count >= 0 else { return errSecParam }
    do {
        try SystemRandom.fill(UnsafeMutableRawBufferPointer(start: bytes, count: count))
    } catch {
        return errSecIO
    }
    return errSecSuccess
}
