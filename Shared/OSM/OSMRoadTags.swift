import DrivebusRoadLimits
import Foundation

/// What a way's OpenStreetMap tags say about driving on it (docs/limits-osm.md has the table):
/// its class from `highway`, its limit from `maxspeed` (`maxspeed:forward` and
/// `maxspeed:backward` where they differ by direction), and whether it is one-way.
/// `maxspeed:conditional`, `:advisory` and `:variable` are not read: a limit that holds only at
/// some hours, or is only advice, is not the posted one.
public enum OSMRoadTags {
    /// The road, and whether its points must be reversed to run in its one-way direction
    /// (`oneway=-1`). Nil for a way that is not a road for cars, or is an area.
    public static func road(_ tag: (String) -> String?) -> (road: RoadWay, reversed: Bool)? {
        guard let highway = tag("highway"), let roadClass = RoadClass(highway: highway) else { return nil }
        if tag("area") == "yes" { return nil }
        let both = tag("maxspeed").flatMap(limit)
        var forward = tag("maxspeed:forward").flatMap(limit) ?? both
        var backward = tag("maxspeed:backward").flatMap(limit) ?? both
        let onewayTag = tag("oneway")
        let reversed = onewayTag == "-1" || onewayTag == "reverse"
        let implied = roadClass == .motorway || tag("junction") == "roundabout" || tag("junction") == "circular"
        let oneway = reversed || onewayTag == "yes" || onewayTag == "true" || onewayTag == "1" || (implied && onewayTag != "no")
        if reversed { swap(&forward, &backward) }
        return (RoadWay(roadClass: roadClass, forward: forward, backward: backward, oneway: oneway), reversed)
    }

    /// A `maxspeed` value: `50`, `30 mph`, `50 km/h`, `none`, `walk`, or an implicit value such
    /// as `DE:urban` (the countries in `implicit`). Nil for what is not a fixed limit
    /// (`signals`, `variable`, an unknown code, nonsense). `50;30` (one limit per lane) takes the
    /// highest: the fastest lane's.
    public static func limit(_ value: String) -> PostedLimit? {
        let text = value.trimmingCharacters(in: .whitespaces).lowercased()
        if text.contains(";") {
            let parts = text.split(separator: ";").map { limit(String($0)) }
            guard !parts.isEmpty, parts.allSatisfy({ $0 != nil }) else { return nil }
            return parts.compactMap { $0 }.max { ($0.kmh ?? .infinity) < ($1.kmh ?? .infinity) }
        }
        switch text {
        case "none": return .unlimited
        case "walk": return .kmh(7)
        default: break
        }
        if let colon = text.firstIndex(of: ":") {
            return implicit(country: String(text[..<colon]), kind: String(text[text.index(after: colon)...]))
        }
        var number = text
        var factor = 1.0
        for (suffix, multiplier) in [("mph", 1.609344), ("km/h", 1.0), ("kmh", 1.0), ("kph", 1.0), ("knots", 1.852)] where number.hasSuffix(suffix) {
            number = String(number.dropLast(suffix.count)).trimmingCharacters(in: .whitespaces)
            factor = multiplier
            break
        }
        guard let speed = Double(number), speed.isFinite, speed > 0, speed <= 300 else { return nil }
        return .kmh((speed * factor * 10).rounded() / 10)
    }

    /// Implicit limits by country and kind of road (`DE:urban`, `GB:nsl_single`, `FR:zone30`,
    /// `DE:zone:30`), as the OSM wiki's table of default speed limits lists them for cars.
    static func implicit(country: String, kind: String) -> PostedLimit? {
        // `zone30`, `zone:30`: a zone with its limit in its name.
        if kind.hasPrefix("zone") {
            let digits = kind.dropFirst(4).drop { $0 == ":" }
            if let speed = Double(digits), speed > 0, speed <= 300 {
                return .kmh(country == "gb" || country == "uk" ? (speed * 1.609344 * 10).rounded() / 10 : speed)
            }
            return nil
        }
        let mph = 1.609344
        let table: [String: [String: PostedLimit]] = [
            "at": ["urban": .kmh(50), "rural": .kmh(100), "trunk": .kmh(100), "motorway": .kmh(130), "living_street": .kmh(5)],
            "be": ["urban": .kmh(50), "rural": .kmh(70), "trunk": .kmh(120), "motorway": .kmh(120), "living_street": .kmh(20)],
            "ch": ["urban": .kmh(50), "rural": .kmh(80), "trunk": .kmh(100), "motorway": .kmh(120), "living_street": .kmh(20)],
            "cz": ["urban": .kmh(50), "rural": .kmh(90), "trunk": .kmh(110), "motorway": .kmh(130), "living_street": .kmh(20)],
            "de": ["urban": .kmh(50), "rural": .kmh(100), "trunk": .unlimited, "motorway": .unlimited, "living_street": .kmh(7), "bicycle_road": .kmh(30)],
            "dk": ["urban": .kmh(50), "rural": .kmh(80), "motorway": .kmh(130)],
            "es": ["urban": .kmh(50), "rural": .kmh(90), "trunk": .kmh(100), "motorway": .kmh(120), "living_street": .kmh(20)],
            "fi": ["urban": .kmh(50), "rural": .kmh(80), "motorway": .kmh(120)],
            "fr": ["urban": .kmh(50), "rural": .kmh(80), "trunk": .kmh(110), "motorway": .kmh(130), "living_street": .kmh(20)],
            "gb": ["nsl_single": .kmh(60 * mph), "nsl_dual": .kmh(70 * mph), "motorway": .kmh(70 * mph), "nsl_restricted": .kmh(30 * mph)],
            "uk": ["nsl_single": .kmh(60 * mph), "nsl_dual": .kmh(70 * mph), "motorway": .kmh(70 * mph), "nsl_restricted": .kmh(30 * mph)],
            "ie": ["urban": .kmh(50), "rural": .kmh(80), "national": .kmh(100), "motorway": .kmh(120)],
            "it": ["urban": .kmh(50), "rural": .kmh(90), "trunk": .kmh(110), "motorway": .kmh(130)],
            "nl": ["urban": .kmh(50), "rural": .kmh(80), "trunk": .kmh(100), "motorway": .kmh(100), "living_street": .kmh(15)],
            "no": ["urban": .kmh(50), "rural": .kmh(80), "motorway": .kmh(110)],
            "pl": ["urban": .kmh(50), "rural": .kmh(90), "trunk": .kmh(120), "motorway": .kmh(140), "living_street": .kmh(20)],
            "pt": ["urban": .kmh(50), "rural": .kmh(90), "trunk": .kmh(100), "motorway": .kmh(120)],
            "ru": ["urban": .kmh(60), "rural": .kmh(90), "motorway": .kmh(110), "living_street": .kmh(20)],
            "se": ["urban": .kmh(50), "rural": .kmh(70), "motorway": .kmh(110)],
        ]
        return table[country]?[kind].map { limit in
            if case .kmh(let kmh) = limit { return .kmh((kmh * 10).rounded() / 10) }
            return limit
        }
    }
}
