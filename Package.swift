// swift-tools-version:6.0
import PackageDescription

// The six services share one shape: a thin executable over the service kit. Their cores get their
// own library targets as their issues fill them in, so each can be tested without sockets.
let services = ["ingest", "trips", "geofence", "checkout", "scorer", "stats", "mqtt"]

func serviceExecutable(_ name: String, _ dependencies: [Target.Dependency] = [], directory: String? = nil) -> Target {
    .executableTarget(
        name: "drivebus-\(name)",
        dependencies: ["DrivebusKit", "DrivebusConfiguration"] + dependencies,
        path: "Services/\(directory ?? name.prefix(1).uppercased() + name.dropFirst())/App",
        linkerSettings: startupOrder("drivebus-\(name)")
    )
}

/// On Linux the executables that run at home are linked by lld with the functions they run from
/// start to rest placed together (deploy/link-order/, written by Benchmarks/link-order.sh): the
/// kernel maps code in 64 KB around each page touched, and scattered start-up code kept most of
/// an executable's code resident (README, "Memory at rest"). Every executable here has its file,
/// empty for those the script does not run. The files are not build inputs: remove the
/// executables to relink them.
func startupOrder(_ executable: String) -> [LinkerSetting] {
    let file = Context.packageDirectory + "/deploy/link-order/\(executable).txt"
    var flags = ["-use-ld=lld", "-Xlinker", "--symbol-ordering-file=\(file)", "-Xlinker", "--no-warn-symbol-ordering"]
    // Relative relocations packed (DT_RELR): the loader reads 0.3 MB of them instead of 1.3 MB at
    // every start. Binaries so linked need glibc 2.36 (Debian 12) or later to run: building for
    // an older host elsewhere, set DRIVEBUS_UNPACKED_RELOCATIONS=1.
    if glibcHasRELR && Context.environment["DRIVEBUS_UNPACKED_RELOCATIONS"] == nil {
        flags += ["-Xlinker", "-z", "-Xlinker", "pack-relative-relocs"]
    }
    return [.unsafeFlags(flags, .when(platforms: [.linux]))]
}

#if canImport(Glibc)
import Glibc
let glibcHasRELR: Bool = {
    var version = [CChar](repeating: 0, count: 32)
    guard confstr(Int32(_CS_GNU_LIBC_VERSION), &version, version.count) > 0 else { return false }
    // "glibc 2.36"
    let numbers = String(decoding: version.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        .split(separator: " ").last?.split(separator: ".").compactMap { Int($0) } ?? []
    return numbers.count >= 2 && (numbers[0], numbers[1]) >= (2, 36)
}()
#else
let glibcHasRELR = false
#endif

let hummingbird = Target.Dependency.product(name: "Hummingbird", package: "hummingbird")
let grdb = Target.Dependency.product(name: "GRDB", package: "GRDB.swift")
let yams = Target.Dependency.product(name: "Yams", package: "Yams")
let logging = Target.Dependency.product(name: "Logging", package: "swift-log")
let deque = Target.Dependency.product(name: "DequeModule", package: "swift-collections")
let heap = Target.Dependency.product(name: "HeapModule", package: "swift-collections")
let lifecycle = Target.Dependency.product(name: "ServiceLifecycle", package: "swift-service-lifecycle")

let package = Package(
    name: "drivebus",
    platforms: [.macOS(.v14)],
    products: [
        .executable(name: "drivebus", targets: ["drivebus"]),
        .executable(name: "drivebus-bus", targets: ["drivebus-bus"]),
        .executable(name: "drivebus-bench", targets: ["drivebus-bench"]),
    ] + services.map { .executable(name: "drivebus-\($0)", targets: ["drivebus-\($0)"]) },
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        .package(url: "https://github.com/jpsim/Yams", from: "6.2.2"),
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.1"),
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.37.0"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        .package(url: "https://github.com/apple/swift-crypto", from: "3.12.3"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
        .package(url: "https://github.com/apple/swift-collections", from: "1.6.0"),
        .package(url: "https://github.com/hummingbird-project/swift-mustache", from: "2.1.1"),
        .package(url: "https://github.com/weichsel/ZIPFoundation", from: "0.9.20"),
        .package(url: "https://github.com/apple/swift-protobuf", from: "1.39.0"),
    ],
    targets: [
        .systemLibrary(
            name: "CZMQ",
            path: "Shared/CZMQ",
            pkgConfig: "libzmq",
            providers: [.apt(["libzmq3-dev"])]
        ),
        .systemLibrary(
            name: "CLibXML2",
            path: "Shared/CLibXML2",
            pkgConfig: "libxml-2.0",
            providers: [.apt(["libxml2-dev"])]
        ),
        .systemLibrary(
            name: "CQREncode",
            path: "Shared/CQREncode",
            pkgConfig: "libqrencode",
            providers: [.apt(["libqrencode-dev"])]
        ),
        .systemLibrary(
            name: "CLibZ",
            path: "Shared/CLibZ",
            pkgConfig: "zlib",
            providers: [.apt(["zlib1g-dev"])]
        ),
        .systemLibrary(
            name: "CMosquitto",
            path: "Shared/CMosquitto",
            pkgConfig: "libmosquitto",
            providers: [.apt(["libmosquitto-dev"])]
        ),
        .target(name: "CDrivebusSupport", path: "Shared/CSupport"),
        // An MQTT v5 client on libmosquitto, on a thread of its own, acknowledging after storage.
        .target(name: "DrivebusMQTT", dependencies: ["CMosquitto", "CDrivebusSupport"], path: "Shared/MQTT"),
        // QR codes for phone setup (libqrencode), drawn for a terminal or as SVG.
        .target(name: "DrivebusQRCode", dependencies: ["CQREncode"], path: "Shared/QRCode"),
        .target(name: "DrivebusZMQ", dependencies: ["CZMQ", "CDrivebusSupport", heap], path: "Shared/ZMQ"),
        // Shared: pure models and the libraries every process uses. Nothing here knows a service.
        .target(name: "DrivebusSchema", path: "Shared/Schema"),
        .target(name: "DrivebusSettings", dependencies: [yams, logging], path: "Shared/Settings"),
        // Append-only files: the ingest journal and every service's log of derived events.
        .target(name: "DrivebusJournal", dependencies: ["DrivebusSchema", "CLibZ", "CDrivebusSupport", deque], path: "Shared/Journal"),
        .target(name: "DrivebusGeo", path: "Shared/Geo"),
        // Posted speed limits of roads: the on-disk index, and matching a drive to its roads.
        .target(name: "DrivebusRoadLimits", dependencies: ["CLibZ", "CDrivebusSupport"], path: "Shared/RoadLimits"),
        // OpenStreetMap extracts (PBF on swift-protobuf and zlib, XML on libxml2) read into that index.
        .target(
            name: "DrivebusOSM",
            dependencies: ["DrivebusRoadLimits", "DrivebusTrackFormats", "CLibZ", .product(name: "SwiftProtobuf", package: "swift-protobuf")],
            path: "Shared/OSM", exclude: ["osmpbf.proto"]
        ),
        // One reader per track file format (GPX on libxml2's pull reader, GeoJSON, CSV): import
        // and route ranking read through it.
        .target(name: "DrivebusTrackFormats", dependencies: ["DrivebusSchema", "CLibXML2"], path: "Shared/TrackFormats"),
        // Seeded generators for synthetic data, shared by the tests and the benchmarks.
        .target(name: "DrivebusTestbed", path: "Shared/Testbed"),
        .target(name: "CheckoutCore", dependencies: ["DrivebusSchema", "DrivebusGeo"], path: "Services/Checkout/Core"),
        .target(name: "GeofenceCore", dependencies: ["DrivebusSchema", "DrivebusGeo"], path: "Services/Geofence/Core"),
        .target(name: "TripsCore", dependencies: ["DrivebusSchema", "DrivebusGeo"], path: "Services/Trips/Core"),
        .target(name: "ScorerCore", dependencies: ["DrivebusSchema", "DrivebusGeo", "DrivebusRoadLimits", "TripsCore", deque], path: "Services/Scorer/Core"),
        .target(name: "MQTTCore", dependencies: ["DrivebusSchema"], path: "Services/MQTT/Core"),
        .target(name: "StatsCore", dependencies: ["DrivebusSchema", "DrivebusGeo", "DrivebusTrackFormats"], path: "Services/Stats/Core"),
        // The stats database: what stats stores and the queries over it.
        .target(
            name: "StatsStore",
            dependencies: [
                "StatsCore", "DrivebusSchema", "DrivebusGeo", grdb, .product(name: "GRDBSQLite", package: "GRDB.swift"),
                .product(name: "Mustache", package: "swift-mustache"),
            ],
            path: "Services/Stats/Store"
        ),
        .target(name: "StatsHTTP", dependencies: ["StatsCore", "StatsStore", "CDrivebusSupport", hummingbird], path: "Services/Stats/HTTP"),
        // The whole config file: the process settings plus every service's section.
        .target(
            name: "DrivebusConfiguration",
            dependencies: ["DrivebusSettings", "DrivebusSchema", "DrivebusGeo", "DrivebusRoadLimits", "CheckoutCore", "GeofenceCore", "TripsCore", "ScorerCore", "StatsCore", "MQTTCore", yams, logging],
            path: "Services/Config"
        ),
        .target(
            name: "DrivebusKit",
            dependencies: [
                "DrivebusZMQ", "DrivebusSchema", "DrivebusGeo", "DrivebusSettings", "DrivebusJournal", "CDrivebusSupport", logging,
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "Shared/Kit"
        ),
        .executableTarget(
            name: "drivebus-bus", dependencies: ["DrivebusKit", "DrivebusConfiguration"], path: "Services/Bus",
            linkerSettings: startupOrder("drivebus-bus")
        ),
        .executableTarget(
            name: "drivebus",
            dependencies: [
                "DrivebusKit", "DrivebusConfiguration", "IngestCore", "DrivebusTrackFormats", "DrivebusQRCode", "MQTTCore", "DrivebusJournal", "DrivebusOSM", "StatsStore", grdb,
                .product(name: "AsyncHTTPClient", package: "async-http-client"), .product(name: "ZIPFoundation", package: "ZIPFoundation"),
            ],
            path: "Services/CLI",
            linkerSettings: startupOrder("drivebus")
        ),
        .executableTarget(
            name: "drivebus-bench",
            dependencies: ["DrivebusKit", "DrivebusConfiguration", "DrivebusJournal", "DrivebusTestbed", "DrivebusTestSupport", "DrivebusFuzz", "CZMQ", "IngestCore", "GeofenceCore", "TripsCore", "ScorerCore", "CheckoutCore", "StatsCore", "StatsStore", "DrivebusMQTT", "MQTTCore", "DrivebusOSM", "DrivebusRoadLimits", .product(name: "ArgumentParser", package: "swift-argument-parser")],
            path: "Benchmarks/Bench"
        ),
        .target(name: "IngestCore", dependencies: ["DrivebusSchema", "DrivebusConfiguration", "DrivebusJournal", "DrivebusTrackFormats"], path: "Services/Ingest/Core"),
        serviceExecutable("ingest", ["IngestCore", "DrivebusJournal", hummingbird, lifecycle]),
        serviceExecutable("geofence", [
            "GeofenceCore", grdb, lifecycle,
            .product(name: "AsyncHTTPClient", package: "async-http-client"),
            .product(name: "Crypto", package: "swift-crypto"),
        ]),
        // What the tests and benchmarks share: temporary directories, the real executables as
        // child processes, one HTTP client, a webhook receiver, bus subscriptions with deadlines.
        .target(
            name: "DrivebusTestSupport",
            dependencies: ["DrivebusKit", "DrivebusConfiguration", "CDrivebusSupport"],
            path: "Tests/Support"
        ),
        // Seeded fuzzing of every parser: a short run in the tests, long runs in drivebus-bench.
        .target(
            name: "DrivebusFuzz",
            dependencies: [
                "DrivebusKit", "DrivebusConfiguration", "DrivebusJournal", "DrivebusTestbed", "DrivebusTestSupport", "IngestCore",
                "StatsCore", "StatsStore", "StatsHTTP", hummingbird, .product(name: "HummingbirdTesting", package: "hummingbird"),
            ],
            path: "Tests/Fuzz"
        ),
        // Fast tests of the pure cores, the models and the stores, in process.
        .testTarget(
            name: "CoreTests",
            dependencies: [
                "DrivebusKit", "DrivebusConfiguration", "DrivebusJournal", "CDrivebusSupport", "DrivebusTestbed", "DrivebusTestSupport", "DrivebusFuzz", "DrivebusTrackFormats",
                "IngestCore", "CheckoutCore", "DrivebusQRCode", "MQTTCore", "DrivebusOSM", "DrivebusRoadLimits",
                "GeofenceCore", "TripsCore", "ScorerCore", "StatsCore", "StatsStore", "StatsHTTP",
                .product(name: "HummingbirdTesting", package: "hummingbird"), grdb,
            ],
            path: "Tests/CoreTests"
        ),
        // Tests that start the real executables in temporary directories.
        .testTarget(
            name: "SystemTests",
            dependencies: [
                "DrivebusKit", "DrivebusConfiguration", "DrivebusTestbed", "DrivebusTestSupport", "GeofenceCore", "CheckoutCore", "ScorerCore",
                "DrivebusMQTT", "MQTTCore",
                .product(name: "Crypto", package: "swift-crypto"), .product(name: "ZIPFoundation", package: "ZIPFoundation"),
                grdb, logging,
            ],
            path: "Tests/SystemTests"
        ),
        serviceExecutable("checkout", ["CheckoutCore"]),
        serviceExecutable("trips", ["TripsCore"]),
        serviceExecutable("scorer", ["ScorerCore", "TripsCore", "DrivebusRoadLimits"]),
        serviceExecutable("mqtt", ["MQTTCore", "DrivebusMQTT", lifecycle, .product(name: "AsyncHTTPClient", package: "async-http-client")], directory: "MQTT"),
        serviceExecutable("stats", ["StatsCore", "StatsStore", "StatsHTTP", "DrivebusQRCode", "DrivebusRoadLimits", hummingbird, lifecycle, .product(name: "Prometheus", package: "swift-prometheus")]),
    ]
)
