import KeychainCore

/// The database schema, its recorded version (`PRAGMA user_version`) and the migrations that lead to it.
///
/// Rows hold no plaintext an app stored: the access group, service and account appear only as keyed
/// BLAKE2b digests (blind indexes); everything else is inside sealed blobs.
///
/// ```
/// meta(name TEXT PRIMARY KEY, value BLOB)            -- 'keyring': the wrapped key hierarchy;
///                                                     -- 'rows': the row-state record (RowState.swift);
///                                                     -- 'unlock-failures'; 'apps': the approved
///                                                     -- registrations, sealed (ItemService+Registrations)
/// items(
///   rowid      INTEGER PRIMARY KEY,
///   ref        BLOB NOT NULL UNIQUE,   -- 16 bytes (creation time + random): the persistent reference's id
///   class      INTEGER NOT NULL,       -- accessibility class (Apple's keybag number, 6…12)
///   agrp_ix    BLOB NOT NULL,          -- blind index of the access group
///   svce_ix    BLOB NOT NULL,          -- blind index of the service (an internet password's server;
///                                      -- ItemClass.indexed, under the class's own hash domain)
///   acct_ix    BLOB NOT NULL,          -- blind index of the account
///   key_ix     BLOB NOT NULL UNIQUE,   -- blind index of Apple's uniqueness key (ItemClass.uniqueness):
///                                      -- (agrp, svce, acct, sync) for generic passwords
///   item_key   BLOB NOT NULL,          -- the item's random key, sealed by the class key
///   attributes BLOB NOT NULL,          -- CBOR map of every attribute, sealed by the item key
///   secret     BLOB NOT NULL)          -- v_Data, sealed by the item key (opened only when asked for)
/// items_by_group_service_account(agrp_ix, svce_ix, acct_ix)   -- version 3 (replaces three indexes)
/// item_attributes(                     -- version 2: the Secret Service attribute index
///   ix   BLOB NOT NULL,                -- blind index of one (name, value), or the Secret Service item mark
///   ref  BLOB NOT NULL,                -- the item's ref
///   PRIMARY KEY (ix, ref))             -- one row per attribute of an item with its own attributes
/// ```
enum Schema {
    static let currentVersion = 3

    /// migrations[i] takes a database from version i to version i + 1.
    static let migrations: [[String]] = [
        [
            """
            CREATE TABLE meta (
                name  TEXT PRIMARY KEY NOT NULL,
                value BLOB NOT NULL
            ) STRICT
            """,
            """
            CREATE TABLE items (
                rowid      INTEGER PRIMARY KEY,
                ref        BLOB NOT NULL UNIQUE,
                class      INTEGER NOT NULL,
                agrp_ix    BLOB NOT NULL,
                svce_ix    BLOB NOT NULL,
                acct_ix    BLOB NOT NULL,
                key_ix     BLOB NOT NULL UNIQUE,
                item_key   BLOB NOT NULL,
                attributes BLOB NOT NULL,
                secret     BLOB NOT NULL
            ) STRICT
            """,
            "CREATE INDEX items_by_service_account ON items(svce_ix, acct_ix)",
            "CREATE INDEX items_by_account ON items(acct_ix)",
            "CREATE INDEX items_by_group ON items(agrp_ix)",
        ],
        // 2: Secret Service attributes, searchable by keyed digest (docs/secret-service.md). A new,
        // empty table: no item or meta row changes, so the row-state record stays valid as it is.
        [
            """
            CREATE TABLE item_attributes (
                ix  BLOB NOT NULL,
                ref BLOB NOT NULL,
                PRIMARY KEY (ix, ref)
            ) STRICT, WITHOUT ROWID
            """,
            "CREATE INDEX item_attributes_by_ref ON item_attributes(ref)",
        ],
        // 3: one (group, service, account) index instead of (service, account), (account) and (group).
        // Every write paid a page in each; two of them land at random, so a durable add wrote two
        // pages more than it needs (docs/performance.md, "Durable adds beside their floors"). An
        // app's queries always name its groups, so by group, group and service, or all three they
        // search this index; by account alone they scan their groups' part of it (digests only, no
        // row is opened); an administrator's query by service or account alone, naming no group,
        // scans the whole index. The index gives the rowids of a search, and the rows are then read
        // in rowid order (RowFilter: no sort of whole rows). Indexes only: no row changes, the
        // row-state record stays valid.
        [
            "DROP INDEX IF EXISTS items_by_service_account",
            "DROP INDEX IF EXISTS items_by_account",
            "DROP INDEX IF EXISTS items_by_group",
            "CREATE INDEX IF NOT EXISTS items_by_group_service_account ON items(agrp_ix, svce_ix, acct_ix)",
        ],
    ]

    /// Brings the database to `currentVersion` in one immediate transaction. A database written by a
    /// newer keychaind is refused rather than guessed at. A migration that changes item or meta rows
    /// must also rewrite the row-state record (RowState.swift), or the next open refuses the file.
    static func migrate(_ db: SQLiteConnection, path: String) throws(KeychainError) {
        try db.execute("BEGIN IMMEDIATE")
        do throws(KeychainError) {
            let version = try db.withStatement("PRAGMA user_version") { (s) throws(KeychainError) in
                _ = try s.step()
                return Int(s.int64(0))
            }
            guard version <= currentVersion else {
                throw KeychainError(
                    .notAvailable,
                    "database \(path) has schema version \(version), newer than this keychaind understands (\(currentVersion)); upgrade keychaind"
                )
            }
            for step in version..<currentVersion {
                for sql in migrations[step] { try db.execute(sql) }
            }
            if version != currentVersion { try db.execute("PRAGMA user_version = \(currentVersion)") }
            try db.execute("COMMIT")
        } catch {
            try? db.execute("ROLLBACK")
            throw error
        }
    }
}
