package config

import (
	"fmt"

	"sandboxd/server/credits"
)

// Plan is one named plan (configs/plans.yaml documents each field).
type Plan struct {
	Name           string        `yaml:"name"`
	MonthlyCredits credits.Milli `yaml:"monthlyCredits"`
	LargestSize    string        `yaml:"largestSize"`
	MaxConcurrent  int           `yaml:"maxConcurrent"`
	EgressMiB      int64         `yaml:"egressMiB"`
	StorageMiB     int64         `yaml:"storageMiB"`
	Pause          bool          `yaml:"pause"`
}

// Plans is the plan table.
type Plans struct {
	Default         string `yaml:"default"`
	FirstOrg        string `yaml:"firstOrg"`
	MinSliceSeconds int    `yaml:"minSliceSeconds"`
	List            []Plan `yaml:"plans"`
}

// ParsePlans decodes and checks a plan table (configs/plans.yaml's format)
// against the size table its largestSize names refer to.
func ParsePlans(b []byte, sizes Sizes) (Plans, error) {
	var p Plans
	if err := decodeStrict(b, &p); err != nil {
		return p, err
	}
	if len(p.List) == 0 {
		return p, fmt.Errorf("no plans defined (want a plans: list)")
	}
	seen := map[string]bool{}
	for _, pl := range p.List {
		if err := ValidPlanName(pl.Name); err != nil || seen[pl.Name] {
			return p, fmt.Errorf("plan %q: empty, repeated or invalid name (lowercase letters, digits, '-')", pl.Name)
		}
		seen[pl.Name] = true
		if pl.MonthlyCredits < 0 || pl.MaxConcurrent < 1 || pl.EgressMiB < 0 || pl.EgressMiB > maxEgressMiB || pl.StorageMiB < 0 || pl.StorageMiB > 1<<40 {
			return p, fmt.Errorf("plan %q: limits out of range (monthlyCredits >= 0, maxConcurrent >= 1, egressMiB >= 0, storageMiB >= 0)", pl.Name)
		}
		if pl.LargestSize != "" {
			if _, ok := sizes.Resolve(pl.LargestSize); !ok {
				return p, fmt.Errorf("plan %q: largestSize %q is not a size (a custom size table needs a plan table naming its sizes: plans.configFile)", pl.Name, pl.LargestSize)
			}
		}
	}
	for k, v := range map[string]string{"default": p.Default, "firstOrg": p.FirstOrg} {
		if v == "" {
			return p, fmt.Errorf("%s: required (a plan name)", k)
		}
		if !seen[v] {
			return p, fmt.Errorf("%s plan %q is not defined", k, v)
		}
	}
	if p.MinSliceSeconds < 0 || p.MinSliceSeconds > 86400 {
		return p, fmt.Errorf("minSliceSeconds: want 0..86400")
	}
	return p, nil
}

// ValidPlanName checks a plan's name: 1-32 of [a-z0-9-].
func ValidPlanName(s string) error {
	if s == "" || len(s) > 32 {
		return fmt.Errorf("want 1-32 characters")
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return fmt.Errorf("want lowercase letters, digits and '-'")
		}
	}
	return nil
}

// Get returns the named plan; "" is the default.
func (p Plans) Get(name string) (Plan, bool) {
	if name == "" {
		name = p.Default
	}
	for _, pl := range p.List {
		if pl.Name == name {
			return pl, true
		}
	}
	return Plan{}, false
}

// Names lists the plans' names.
func (p Plans) Names() []string {
	out := make([]string, len(p.List))
	for i, pl := range p.List {
		out[i] = pl.Name
	}
	return out
}

// Allows reports whether a plan may run size z: not above its largest size
// in vCPUs or memory (sizes of the table rank by what they take, so a
// custom small size fits every plan).
func (pl Plan) Allows(sizes Sizes, z Size) bool {
	if pl.LargestSize == "" {
		return true
	}
	big, ok := sizes.Resolve(pl.LargestSize)
	if !ok {
		return false
	}
	return z.VCPUs <= big.VCPUs && z.MemoryMiB <= big.MemoryMiB
}
