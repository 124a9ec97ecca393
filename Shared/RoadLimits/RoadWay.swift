/// The kinds of road the index keeps: the ones a car drives on, named as OpenStreetMap's
/// `highway=*` values. Footways, cycleways, paths and steps are left out at import: a car is never
/// on them, and beside a road they would only compete with it when matching.
public enum RoadClass: UInt8, Sendable, CaseIterable, Codable {
    case motorway = 1, motorwayLink, trunk, trunkLink, primary, primaryLink, secondary, secondaryLink
    case tertiary, tertiaryLink, unclassified, residential, livingStreet, service, road, track, busway

    /// The class of an OSM `highway` value, or nil for a way that is not a road for cars.
    public init?(highway: String) {
        guard let match = Self.allCases.first(where: { $0.osmName == highway }) else { return nil }
        self = match
    }

    public var osmName: String {
        switch self {
        case .motorway: "motorway"
        case .motorwayLink: "motorway_link"
        case .trunk: "trunk"
        case .trunkLink: "trunk_link"
        case .primary: "primary"
        case .primaryLink: "primary_link"
        case .secondary: "secondary"
        case .secondaryLink: "secondary_link"
        case .tertiary: "tertiary"
        case .tertiaryLink: "tertiary_link"
        case .unclassified: "unclassified"
        case .residential: "residential"
        case .livingStreet: "living_street"
        case .service: "service"
        case .road: "road"
        case .track: "track"
        case .busway: "busway"
        }
    }

    /// Minor roads that through traffic seldom uses: beside a major road, matching needs more
    /// evidence to put a car on them.
    var isMinor: Bool { self == .service || self == .track || self == .livingStreet || self == .busway }
}

/// A posted limit as the index stores it.
public enum PostedLimit: Sendable, Equatable, Hashable {
    case kmh(Double)
    /// Signed as having no limit (German Autobahn: `maxspeed=none`).
    case unlimited

    /// Tenths of km/h in 16 bits: 0 is "not known", 0xFFFF "no limit".
    init?(stored: UInt16) {
        switch stored {
        case 0: return nil
        case .max: self = .unlimited
        default: self = .kmh(Double(stored) / 10)
        }
    }

    var stored: UInt16 {
        switch self {
        case .unlimited: .max
        case .kmh(let kmh): UInt16(min(max((kmh * 10).rounded(), 1), Double(UInt16.max - 1)))
        }
    }

    /// The limit in km/h, or nil when there is none.
    public var kmh: Double? {
        if case .kmh(let value) = self { return value }
        return nil
    }
}

/// One road as the index keeps it: its class, its limit each way, and whether it is one-way.
/// Points of a one-way road are stored in its direction of travel, so `forward` is the limit
/// along the stored order and `backward` against it.
public struct RoadWay: Sendable, Equatable {
    public var roadClass: RoadClass
    public var forward: PostedLimit?
    public var backward: PostedLimit?
    public var oneway: Bool

    public init(roadClass: RoadClass, forward: PostedLimit?, backward: PostedLimit?, oneway: Bool) {
        self.roadClass = roadClass
        self.forward = forward
        self.backward = backward
        self.oneway = oneway
    }

    var packed: UInt64 {
        UInt64(forward?.stored ?? 0) | UInt64(backward?.stored ?? 0) << 16 | UInt64(roadClass.rawValue) << 32
            | (oneway ? 1 << 40 : 0)
    }

    init?(packed: UInt64) {
        guard let roadClass = RoadClass(rawValue: UInt8(truncatingIfNeeded: packed >> 32)) else { return nil }
        self.roadClass = roadClass
        forward = PostedLimit(stored: UInt16(truncatingIfNeeded: packed))
        backward = PostedLimit(stored: UInt16(truncatingIfNeeded: packed >> 16))
        oneway = packed & (1 << 40) != 0
    }

    /// Whether a limit is tagged in either direction.
    public var isTagged: Bool { forward != nil || backward != nil }
}
