import DrivebusSchema

/// score = 100 − Σ component points, clamped to 0…100:
/// - `speed_variation`: weight × (speed variation − `speed_variation_calm_mps2`) per 0.1 m/s²,
///   nothing at or below the calm level;
/// - `harsh_brake`, `harsh_accel`, `harsh_corner`: weight × events of that type per 100 km;
/// - `speeding`: weight × speeding seconds per hour.
/// Rates are taken over at least `score_min_distance_km` and `score_min_duration_s`, so a short
/// hop is not condemned by one event. docs/scoring.md gives the reason for each weight.
struct Score {
    let score: Double
    let counts: [String: Int]
    let eventsPer100km: Double
    let components: [ScoreComponent]

    init(events: [DriveEvent], distanceM: Double, durationS: Double, speedingS: Double, speedVariation: Double, tuning: Tuning) {
        var byType: [DriveEventType: Int] = [:]
        for event in events { byType[event.type, default: 0] += 1 }
        var counts: [String: Int] = [:]
        for type in DriveEventType.allCases { counts[type.rawValue] = byType[type] ?? 0 }
        self.counts = counts

        let km = max(distanceM.isFinite ? distanceM / 1000 : 0, tuning.minDistanceKm)
        let hours = max(durationS.isFinite ? durationS : 0, tuning.minDurationS) / 3600
        func per100km(_ type: DriveEventType) -> Double { Double(byType[type] ?? 0) * 100 / km }
        let w = tuning.weights
        let variation = speedVariation.isFinite ? speedVariation : 0
        let speedingRate = (speedingS.isFinite ? speedingS : 0) / hours
        func component(_ name: String, _ value: Double, _ unit: String, _ points: Double) -> ScoreComponent {
            ScoreComponent(name: name, value: rounded(value, 3), unit: unit, points: rounded(points, 2))
        }
        components = [
            component("speed_variation", variation, "mps2", w.speedVariation * max(variation - tuning.calmVariation, 0) / 0.1),
            component("harsh_brake", per100km(.harshBrake), "per_100km", w.harshBrake * per100km(.harshBrake)),
            component("harsh_accel", per100km(.harshAccel), "per_100km", w.harshAccel * per100km(.harshAccel)),
            component("harsh_corner", per100km(.harshCorner), "per_100km", w.harshCorner * per100km(.harshCorner)),
            component("speeding", speedingRate, "s_per_h", w.speedingSPerH * speedingRate),
        ]
        let penalty = components.reduce(0) { $0 + $1.points }
        score = rounded(min(max(100 - penalty, 0), 100), 1)
        eventsPer100km = rounded(per100km(.harshBrake) + per100km(.harshAccel) + per100km(.harshCorner), 2)
    }
}
