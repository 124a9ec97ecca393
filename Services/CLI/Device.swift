import ArgumentParser
import DrivebusConfiguration
import DrivebusKit
import DrivebusQRCode
import DrivebusSchema
import Foundation
import MQTTCore

/// `drivebus device add|list|remove|rotate-token`: the phones that may send, kept in the state
/// directory's registry (`DeviceRegistry`), never in the user's config file. The running ingest
/// picks a change up within a second.
struct DeviceCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "device", abstract: "Add a phone and show how to connect it; list, remove, or give a new token.",
        subcommands: [Add.self, List.self, Remove.self, RotateToken.self])

    typealias App = PhoneApp

    struct Add: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Add a device with a new token and print what to enter in the app, with a QR code.")

        @OptionGroup var options: ConfigOption
        @Argument(help: "The device's name: letters, digits, - and _.")
        var name: String
        @Option(help: "The app on the phone: \(App.allCases.map(\.rawValue).joined(separator: ", ")).")
        var app: App = .owntracks
        @Option(help: "The address the phone reaches ingest at, e.g. https://drivebus.example.net (default: from ingest.listen).")
        var url: String?

        func run() throws {
            let config = try loadConfig(options)
            guard DeviceID.isValid(name) else { throw ValidationError("the name must match [A-Za-z0-9_-]{1,64}") }
            let token = try updateEntries(DeviceRegistry(layout: config.layout)) { entries -> Result<String, ValidationError> in
                guard !config.devices(with: entries).contains(where: { $0.id == name }) else {
                    return .failure(ValidationError("device \"\(name)\" exists; `drivebus device rotate-token \(name)` gives it a new token and shows the setup again"))
                }
                let token = DeviceRegistry.newToken()
                entries.append(DeviceRegistry.Entry(id: name, tokenSHA256: TokenDigest.hex(token), app: app.rawValue, addedAt: Date()))
                return .success(token)
            }
            print("Added device \"\(name)\". The running system accepts it within a second.\n")
            print(PhoneSetup(device: name, token: token, base: url ?? PhoneSetup.base(config)).instructions(for: app, warnLoopback: url == nil && config.ingest.publicURL == nil && config.ingest.listen.isLoopback))
            if app == .owntracks, let mqtt = config.mqtt { print(mqttSteps(mqtt, device: name)) }
        }
    }

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List the devices: from the config file and added with `drivebus device add`.")

        @OptionGroup var options: ConfigOption

        func run() throws {
            let config = try loadConfig(options)
            let entries = try loadEntries(DeviceRegistry(layout: config.layout))
            let configured = Set(config.devices.map(\.id))
            print("DEVICE".padding(toLength: 24, withPad: " ", startingAt: 0) + "FROM      APP        ADDED")
            for device in config.devices(with: entries) {
                let entry = entries.first { $0.id == device.id && !configured.contains(device.id) }
                let from = entry == nil ? "config" : "added"
                let added = entry.map { RFC3339.format($0.addedAt) } ?? "-"
                print(device.id.padding(toLength: 24, withPad: " ", startingAt: 0)
                    + from.padding(toLength: 10, withPad: " ", startingAt: 0)
                    + (entry?.app ?? "-").padding(toLength: 11, withPad: " ", startingAt: 0) + added)
            }
        }
    }

    struct Remove: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Remove an added device: its token is refused from then on. Its data stays.")

        @OptionGroup var options: ConfigOption
        @Argument var name: String

        func run() throws {
            let config = try loadConfig(options)
            try updateEntries(DeviceRegistry(layout: config.layout)) { entries -> Result<Void, ValidationError> in
                if let refusal = refusal(name, config, entries) { return .failure(refusal) }
                entries.removeAll { $0.id == name }
                return .success(())
            }
            print("Removed device \"\(name)\": its token is refused within a second. Its fixes and trips stay.")
        }
    }

    struct RotateToken: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "rotate-token", abstract: "Give an added device a new token (the old one is refused) and show the setup again.")

        @OptionGroup var options: ConfigOption
        @Argument var name: String
        @Option(help: "The app on the phone (default: the one it was added for).")
        var app: App?
        @Option(help: "The address the phone reaches ingest at (default: from ingest.listen).")
        var url: String?

        func run() throws {
            let config = try loadConfig(options)
            let (token, entry) = try updateEntries(DeviceRegistry(layout: config.layout)) { entries -> Result<(String, DeviceRegistry.Entry), ValidationError> in
                if let refusal = refusal(name, config, entries) { return .failure(refusal) }
                guard let rotated = DeviceRegistry.rotate(name, in: &entries, app: app?.rawValue, digest: TokenDigest.hex) else {
                    return .failure(ValidationError("no device \"\(name)\""))
                }
                return .success(rotated)
            }
            print("New token for \"\(name)\"; the old one is refused within a second.\n")
            let chosen = app ?? entry.app.flatMap(App.init(rawValue:)) ?? .owntracks
            print(PhoneSetup(device: name, token: token, base: url ?? PhoneSetup.base(config))
                .instructions(for: chosen, warnLoopback: url == nil && config.ingest.publicURL == nil && config.ingest.listen.isLoopback))
        }
    }
}

/// OwnTracks' default mode, when drivebus reads a broker: what to enter instead of HTTP.
private func mqttSteps(_ mqtt: MQTTConfiguration, device: String) -> String {
    let mapped = mqtt.ownTracks.devices.first { $0.value == device }?.key
    let topic = mapped.map { "\(mqtt.ownTracks.baseTopic)/\($0)" } ?? "\(mqtt.ownTracks.baseTopic)/<user>/\(device)"
    // With a map of topics, an unlisted topic is refused: the new device needs its line.
    let listIt = mapped == nil && !mqtt.ownTracks.devices.isEmpty
        ? "\nThen list it under mqtt.owntracks.devices in the config (\"<user>/\(device)\": \(device)) and restart drivebus-mqtt: with a map, unlisted topics are refused."
        : ""
    return """
        Or in MQTT mode (drivebus reads \(mqtt.host):\(mqtt.port)): Mode MQTT, Host \(mqtt.host), Port \(mqtt.port)\(mqtt.tls == nil ? "" : ", TLS on"),
        the phone's own broker user and password, and the UserID and DeviceID that make its topic \(topic)\(mapped == nil ? " (DeviceID \(device))" : "").\(listIt)
        """
}

private func loadEntries(_ registry: DeviceRegistry) throws -> [DeviceRegistry.Entry] {
    do { return try registry.load() } catch {
        FileHandle.standardError.write(Data("drivebus device: \(error)\n".utf8))
        throw ExitCode(2)
    }
}

/// Changes the registry under its lock; a refusal leaves it as it was.
@discardableResult
private func updateEntries<T>(_ registry: DeviceRegistry, _ change: (inout [DeviceRegistry.Entry]) -> Result<T, ValidationError>) throws -> T {
    let outcome: Result<T, ValidationError>
    do {
        outcome = try registry.update { entries in change(&entries) }
    } catch {
        FileHandle.standardError.write(Data("drivebus device: \(error)\n".utf8))
        throw ExitCode(2)
    }
    return try outcome.get()
}

/// Why `name` cannot be removed or given a new token here, if it cannot.
private func refusal(_ name: String, _ config: DrivebusConfig, _ entries: [DeviceRegistry.Entry]) -> ValidationError? {
    if config.devices.contains(where: { $0.id == name }) { return ValidationError("device \"\(name)\" is in the config file: change it there") }
    return entries.contains(where: { $0.id == name }) ? nil : ValidationError("no device \"\(name)\"")
}

extension PhoneApp: ExpressibleByArgument {}

extension PhoneSetup {
    /// The text for `app` in a terminal, with a QR code of its link (or of the URL to enter).
    func instructions(for app: PhoneApp, warnLoopback: Bool) -> String {
        let code = code(for: app)
        let (scan, byHand) = steps(for: app)
        let qr = (try? QRCode(code).terminal()).map { $0 + "\n" } ?? ""
        var text = scan + "\n\n" + qr
        text += [.owntracks, .overland].contains(app) ? code + "\n\n" + byHand + "\n" : byHand + "\n"
        if warnLoopback {
            text += "\nNote: ingest listens on \(base) only, which a phone cannot reach. Set ingest.listen "
                + "(e.g. \"0.0.0.0:5055\", ideally behind a TLS reverse proxy) and run this with --url.\n"
        }
        text += "\nThe token is a password: anyone with it can send fixes as \(device). It is shown only now (drivebus keeps "
            + "a hash of it); `drivebus device rotate-token \(device)` makes a new one.\n"
        return text
    }
}
