-- Wireshark/tshark dissector for the ina in-network aggregation protocol, version 1
-- (docs/PROTOCOL.md section 2).
--
-- Install: copy this one file into the personal Lua plugins folder
-- (~/.local/lib/wireshark/plugins/ on Linux; Wireshark shows the folder under
-- Help > About > Folders), or load it for one run: `tshark -X lua_script:ina.lua ...`.
--
-- Dissects UDP port 18766 (0x494E) in both directions: requests go to the port, replies come
-- from it. A heuristic for that port is registered too, for UDP's "try heuristic
-- sub-dissectors first" when another dissector holds the worker's port. Display filter
-- prefix: `ina` (ina.type, ina.job, ina.seq, ...).

local INA_PORT = 18766
local HEADER_LEN = 16
-- Payload values listed one by one for Data, Result and unknown types; the rest is summarized.
local SHOWN_VALUES = 8

local ina = Proto("ina", "ina In-Network Aggregation")

local TYPE_NAMES = {
    [1] = "Data",
    [2] = "Result",
    [3] = "Reject",
    [4] = "Probe",
    [5] = "ProbeReply",
    [6] = "Pending",
    [7] = "Query",
    [8] = "Missing",
}

local REJECT_REASONS = {
    [1] = "StaleEpoch",
    [2] = "SlotOutOfRange",
    [3] = "BadCount",
}

local f = {
    version = ProtoField.uint8("ina.version", "Version", base.DEC, nil, 0xF0),
    type = ProtoField.uint8("ina.type", "Type", base.DEC, TYPE_NAMES, 0x0F),
    flags = ProtoField.uint8("ina.flags", "Flags", base.HEX),
    set = ProtoField.uint8("ina.set", "Set", base.DEC, nil, 0x01),
    gap = ProtoField.bool("ina.gap", "Gap counter present", 8, nil, 0x02),
    gap_counter = ProtoField.uint8("ina.gap_counter", "Gap counter", base.DEC),
    reserved = ProtoField.uint8("ina.reserved", "Reserved", base.HEX),
    missing = ProtoField.uint8("ina.missing", "Missing first transmissions", base.DEC),
    job = ProtoField.uint16("ina.job", "Job", base.DEC),
    epoch = ProtoField.uint16("ina.epoch", "Epoch", base.DEC),
    rank = ProtoField.uint8("ina.rank", "Rank", base.DEC),
    exponent = ProtoField.uint8("ina.exponent", "Exponent", base.DEC),
    reject_reason = ProtoField.uint8("ina.reject_reason", "Reject reason", base.DEC, REJECT_REASONS),
    query_wants = ProtoField.bool("ina.query.wants_elements", "Wants a Result of E elements (bit 0)"),
    query_partial = ProtoField.bool("ina.query.pushes_partial", "Asks a rack switch to send the partial up again (rank 0, any nonzero byte)"),
    slot = ProtoField.uint16("ina.slot", "Slot", base.DEC),
    count = ProtoField.uint16("ina.count", "Count", base.DEC),
    seq = ProtoField.uint32("ina.seq", "Sequence", base.DEC),
    payload = ProtoField.bytes("ina.payload", "Payload"),
    elements = ProtoField.uint32("ina.elements", "Elements present", base.DEC),
    value = ProtoField.int32("ina.value", "Value", base.DEC),
    probe_workers = ProtoField.int32("ina.probe.workers", "Workers", base.DEC),
    probe_elems = ProtoField.int32("ina.probe.elems", "Elements per packet", base.DEC),
    probe_slot_base = ProtoField.int32("ina.probe.slot_base", "First slot", base.DEC),
    probe_slot_count = ProtoField.int32("ina.probe.slot_count", "Slot count", base.DEC),
    probe_group = ProtoField.ipv4("ina.probe.group", "Multicast group"),
    probe_group_port = ProtoField.uint32("ina.probe.group_port", "Multicast group UDP port", base.DEC),
    bitmap = ProtoField.uint32("ina.bitmap", "Contributor bitmap", base.HEX),
    ranks = ProtoField.string("ina.pending.ranks", "Contributing ranks"),
    pending_rank = ProtoField.uint8("ina.pending.rank", "Contributor", base.DEC),
}
ina.fields = {
    f.version, f.type, f.flags, f.set, f.gap, f.gap_counter, f.reserved, f.missing, f.job, f.epoch, f.rank, f.exponent,
    f.reject_reason, f.query_wants, f.query_partial, f.slot, f.count, f.seq, f.payload, f.elements, f.value,
    f.probe_workers, f.probe_elems, f.probe_slot_base, f.probe_slot_count, f.probe_group,
    f.probe_group_port, f.bitmap, f.ranks,
    f.pending_rank,
}

local e = {
    truncated = ProtoExpert.new("ina.truncated", "Shorter than the 16-byte header",
        expert.group.MALFORMED, expert.severity.ERROR),
    length = ProtoExpert.new("ina.bad_length", "Length is not 16 + 4 * count",
        expert.group.MALFORMED, expert.severity.WARN),
    version = ProtoExpert.new("ina.bad_version", "Unknown protocol version",
        expert.group.MALFORMED, expert.severity.WARN),
    type = ProtoExpert.new("ina.bad_type", "Unknown message type",
        expert.group.MALFORMED, expert.severity.WARN),
    reserved = ProtoExpert.new("ina.reserved_set", "Reserved flag bits set",
        expert.group.PROTOCOL, expert.severity.WARN),
    reason = ProtoExpert.new("ina.bad_reason", "Unknown reject reason",
        expert.group.MALFORMED, expert.severity.WARN),
    payload = ProtoExpert.new("ina.bad_payload", "Payload size unexpected for the message type",
        expert.group.PROTOCOL, expert.severity.WARN),
    group = ProtoExpert.new("ina.bad_group", "ProbeReply's group is not a multicast address and port",
        expert.group.MALFORMED, expert.severity.WARN),
}
ina.experts = {
    e.truncated, e.length, e.version, e.type, e.reserved, e.reason, e.payload, e.group,
}

-- Ranks whose bit is set in a 32-bit bitmap, lowest first (plain arithmetic: no bit library
-- needed, so any Lua version Wireshark embeds will do).
local function bitmap_ranks(bitmap)
    local ranks = {}
    local rest = bitmap
    for rank = 0, 31 do
        if rest % 2 == 1 then
            ranks[#ranks + 1] = rank
        end
        rest = math.floor(rest / 2)
    end
    return ranks
end

-- Payload elements per message type that the protocol fixes (nil: any). A ProbeReply has 4,
-- or 6 when it names the job's multicast group (PROTOCOL.md sections 2 and 3).
local FIXED_COUNTS = { [3] = { 0 }, [4] = { 0 }, [5] = { 4, 6 }, [6] = { 1 }, [7] = { 0 }, [8] = { 0 } }

-- Whether `count` is one of `counts`.
local function one_of(counts, count)
    for _, c in ipairs(counts) do
        if c == count then
            return true
        end
    end
    return false
end

local function add_values(tree, tvb, first, n)
    local shown = math.min(n, SHOWN_VALUES)
    for i = 0, shown - 1 do
        tree:add(f.value, tvb(first + 4 * i, 4))
    end
    if n > shown then
        tree:add(tvb(first + 4 * shown, 4 * (n - shown)),
            string.format("[%d more values]", n - shown))
    end
end

local function dissect(tvb, pinfo, root)
    local len = tvb:len()
    pinfo.cols.protocol = "INA"
    local tree = root:add(ina, tvb())
    if len < HEADER_LEN then
        tree:add_proto_expert_info(e.truncated,
            string.format("Shorter than the 16-byte header: %d bytes", len))
        pinfo.cols.info = string.format("Truncated (%d bytes)", len)
        return len
    end

    local vt = tvb(0, 1):uint()
    local version = math.floor(vt / 16)
    local mtype = vt % 16
    local flags = tvb(1, 1):uint()
    local set = flags % 2
    local job = tvb(2, 2):uint()
    local epoch = tvb(4, 2):uint()
    local rank = tvb(6, 1):uint()
    local exponent = tvb(7, 1):uint()
    local slot = tvb(8, 2):uint()
    local count = tvb(10, 2):uint()
    local seq = tvb(12, 4):uint()
    local name = TYPE_NAMES[mtype] or string.format("Unknown type %d", mtype)
    -- A Query asks a rack switch for the partial when it is rank 0's and its byte is nonzero
    -- (a fetch, 1, or a status and partial, 2); other ranks' bytes ask for nothing more.
    local pushes_partial = mtype == 7 and rank == 0 and exponent ~= 0

    local vitem = tree:add(f.version, tvb(0, 1))
    if version ~= 1 then
        vitem:add_proto_expert_info(e.version,
            string.format("Unknown protocol version %d (1 expected)", version))
    end
    local titem = tree:add(f.type, tvb(0, 1))
    if TYPE_NAMES[mtype] == nil then
        titem:add_proto_expert_info(e.type, string.format("Unknown message type %d", mtype))
    end
    local fitem = tree:add(f.flags, tvb(1, 1))
    fitem:add(f.set, tvb(1, 1))
    -- Bit 1 says whether bits 2-7 hold a gap counter; without it they are reserved.
    local gapflag = math.floor(flags / 2) % 2
    local high = math.floor(flags / 4)
    fitem:add(f.gap, tvb(1, 1))
    if gapflag == 1 then
        fitem:add(f.gap_counter, tvb(1, 1), high)
        fitem:add(f.reserved, tvb(1, 1), 0)
    else
        local ritem = fitem:add(f.reserved, tvb(1, 1), high * 4)
        if high ~= 0 then
            ritem:add_proto_expert_info(e.reserved,
                string.format("Reserved flag bits set: 0x%02x (sent as 0)", high * 4))
        end
    end
    tree:add(f.job, tvb(2, 2))
    tree:add(f.epoch, tvb(4, 2))
    tree:add(f.rank, tvb(6, 1))
    local xitem = tree:add(f.exponent, tvb(7, 1))
    if mtype == 3 then
        local reason = xitem:add(f.reject_reason, tvb(7, 1))
        if REJECT_REASONS[exponent] == nil then
            reason:add_proto_expert_info(e.reason,
                string.format("Unknown reject reason %d", exponent))
        end
    elseif mtype == 7 then
        xitem:add(f.query_wants, tvb(7, 1), exponent % 2 == 1)
        xitem:add(f.query_partial, tvb(7, 1), pushes_partial)
    elseif mtype == 8 then
        xitem:add(f.missing, tvb(7, 1), exponent)
    end
    tree:add(f.slot, tvb(8, 2))
    local citem = tree:add(f.count, tvb(10, 2))
    tree:add(f.seq, tvb(12, 4))

    local expected = HEADER_LEN + 4 * count
    if len ~= expected then
        citem:add_proto_expert_info(e.length,
            string.format("Length %d is not 16 + 4 * count = %d", len, expected))
    end
    local fixed = FIXED_COUNTS[mtype]
    if fixed ~= nil and not one_of(fixed, count) then
        citem:add_proto_expert_info(e.payload,
            string.format("%s carries %d elements, %s expected", name, count,
                table.concat(fixed, " or ")))
    end

    -- Only whole elements that are present are decoded; a short payload is flagged above.
    local present = math.floor((len - HEADER_LEN) / 4)
    local n = math.min(count, present)
    local info = string.format("%s job=%d epoch=%d rank=%d slot=%d set=%d seq=%d count=%d",
        name, job, epoch, rank, slot, set, seq, count)

    if len > HEADER_LEN then
        local ptree = tree:add(f.payload, tvb(HEADER_LEN))
        ptree:add(f.elements, tvb(HEADER_LEN), n):set_generated()
        if mtype == 5 and n >= 4 then
            ptree:add(f.probe_workers, tvb(16, 4))
            ptree:add(f.probe_elems, tvb(20, 4))
            ptree:add(f.probe_slot_base, tvb(24, 4))
            ptree:add(f.probe_slot_count, tvb(28, 4))
            local base = tvb(24, 4):int()
            info = info .. string.format(" workers=%d elems=%d slots=%d..%d",
                tvb(16, 4):int(), tvb(20, 4):int(), base, base + tvb(28, 4):int())
            if n >= 6 then
                -- The job's multicast group: its IPv4 address as one element, its UDP port.
                local first = tvb(32, 1):uint()
                local ip = string.format("%d.%d.%d.%d", first, tvb(33, 1):uint(),
                    tvb(34, 1):uint(), tvb(35, 1):uint())
                local port = tvb(36, 4):uint()
                local gitem = ptree:add(f.probe_group, tvb(32, 4))
                if first < 224 or first > 239 then
                    gitem:add_proto_expert_info(e.group,
                        string.format("Group %s is not an IPv4 multicast address", ip))
                end
                local pitem = ptree:add(f.probe_group_port, tvb(36, 4))
                if port == 0 or port > 65535 then
                    pitem:add_proto_expert_info(e.group,
                        string.format("Group port %d is not 1..65535", port))
                end
                info = info .. string.format(" group=%s:%d", ip, port)
                add_values(ptree, tvb, HEADER_LEN + 24, n - 6)
            else
                add_values(ptree, tvb, HEADER_LEN + 16, n - 4)
            end
        elseif mtype == 6 and n >= 1 then
            local bitmap = tvb(16, 4):uint()
            local bitem = ptree:add(f.bitmap, tvb(16, 4))
            local ranks = bitmap_ranks(bitmap)
            local parts = {}
            for i, r in ipairs(ranks) do
                parts[i] = tostring(r)
            end
            local list = table.concat(parts, ",")
            bitem:add(f.ranks, tvb(16, 4), list):set_generated()
            for _, r in ipairs(ranks) do
                bitem:add(f.pending_rank, tvb(16, 4), r):set_generated()
            end
            info = info .. " ranks=[" .. list .. "]"
            add_values(ptree, tvb, HEADER_LEN + 4, n - 1)
        else
            add_values(ptree, tvb, HEADER_LEN, n)
        end
    end
    if mtype == 3 then
        info = info .. " reason=" .. (REJECT_REASONS[exponent] or tostring(exponent))
    elseif mtype == 7 then
        info = info .. (exponent % 2 == 1 and " wants=E" or " wants=0")
        if pushes_partial then
            info = info .. " +partial"
        end
    elseif mtype == 8 then
        info = info .. string.format(" missing=%d", exponent)
    end
    if gapflag == 1 then
        info = info .. string.format(" gap=%d", high)
    end
    pinfo.cols.info = info
    tree:append_text(string.format(", %s", name))
    return len
end

function ina.dissector(tvb, pinfo, root)
    return dissect(tvb, pinfo, root)
end

-- For UDP conversations where another dissector owns the worker's port: a packet to or from
-- 18766 whose first byte has version 1 and a known type.
local function heuristic(tvb, pinfo, root)
    if pinfo.src_port ~= INA_PORT and pinfo.dst_port ~= INA_PORT then
        return false
    end
    if tvb:len() < HEADER_LEN then
        return false
    end
    local vt = tvb(0, 1):uint()
    if math.floor(vt / 16) ~= 1 or TYPE_NAMES[vt % 16] == nil then
        return false
    end
    dissect(tvb, pinfo, root)
    return true
end

DissectorTable.get("udp.port"):add(INA_PORT, ina)
ina:register_heuristic("udp", heuristic)
