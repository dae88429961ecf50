-- `$/quickdraft/stats` notifications: running totals and the text shown by :QuickdraftStatus.
-- Pure functions, unit-tested by tests/config_spec.lua.

local M = {}

local function number(value)
  if type(value) == 'number' and value == value and value ~= math.huge and value ~= -math.huge then
    return value
  end
  return nil
end

local function sum_counts(counts)
  if type(counts) ~= 'table' then
    return nil
  end
  local total = 0
  for _, value in pairs(counts) do
    local n = number(value)
    if n and n > 0 then
      total = total + n
    end
  end
  return total
end

--- The notification's params with snake_case keys (`latencyMs` -> `latency_ms`, ...); a
--- snake_case key wins over its camelCase twin.
---@param raw any
---@return table
function M.normalize(raw)
  local out = {}
  if type(raw) ~= 'table' then
    return out
  end
  for key, value in pairs(raw) do
    if type(key) == 'string' then
      local snake = (key:sub(1, 1) .. key:sub(2):gsub('(%u)', '_%1')):lower()
      if out[snake] == nil or snake == key then
        out[snake] = value
      end
    end
  end
  return out
end

--- accepted / drafted for one completion (nil when the server did not say how many it drafted).
---@param stats table
---@return number|nil rate, number|nil accepted, number|nil drafted
function M.acceptance(stats)
  local accepted = sum_counts(stats.accepted_by_source)
  local drafted = sum_counts(stats.drafted_by_source)
  if accepted and drafted and drafted > 0 then
    return math.min(1, accepted / drafted), accepted, drafted
  end
  return nil, accepted, drafted
end

local function ms(value)
  if value >= 10000 then
    return ('%.1f s'):format(value / 1000)
  end
  return ('%d ms'):format(math.floor(value + 0.5))
end

--- Tokens per target forward as shown: nil for a cached answer (no forward) or one without
--- tokens; never below 1 for a computed answer (every forward yields at least one token, so a
--- smaller figure is a counting slip on the server's side: see too_few_tokens_per_forward).
---@param stats table
---@return number|nil
function M.shown_tokens_per_forward(stats)
  local tpf = number(stats.tokens_per_forward)
  if stats.cached == true or not tpf or number(stats.tokens) == 0 then
    return nil
  end
  return math.max(1, tpf)
end

--- Whether the server reported fewer than one token per forward for a computed answer.
---@param stats table
---@return boolean
function M.too_few_tokens_per_forward(stats)
  local tpf = number(stats.tokens_per_forward)
  local tokens = number(stats.tokens)
  return stats.cached ~= true and tpf ~= nil and tpf < 1 and (tokens == nil or tokens > 0)
end

--- A short line: `84 ms · 2.7 tok/fwd · 75% acc` (or `40% drafted` without drafted counts), or
--- `cached` for an answer that took no model work.
---@param stats table|nil
---@return string
function M.format(stats)
  if type(stats) ~= 'table' then
    return 'no completion yet'
  end
  if stats.cached == true then
    return 'cached'
  end
  local parts = {}
  local latency = number(stats.latency_ms)
  table.insert(parts, latency and ms(latency) or '-')
  local tpf = M.shown_tokens_per_forward(stats)
  if tpf then
    table.insert(parts, ('%.1f tok/fwd'):format(tpf))
  end
  local rate, accepted = M.acceptance(stats)
  local tokens = number(stats.tokens)
  if rate then
    table.insert(parts, ('%d%% acc'):format(math.floor(rate * 100 + 0.5)))
  elseif accepted and tokens and tokens > 0 then
    table.insert(parts, ('%d%% drafted'):format(math.floor(math.min(1, accepted / tokens) * 100 + 0.5)))
  end
  return table.concat(parts, ' · ')
end

--- Running totals over a session.
---@return table
function M.new_totals()
  -- completions counts every answer, `cached` those without model work; tokens, latency and
  -- acceptance are over the computed ones.
  return { completions = 0, cached = 0, tokens = 0, latency_ms = 0, accepted = 0, drafted = 0, last = nil }
end

---@param totals table
---@param stats table
function M.add(totals, stats)
  if type(stats) ~= 'table' then
    return
  end
  stats = M.normalize(stats)
  totals.last = stats
  totals.completions = totals.completions + 1
  if stats.cached == true then
    totals.cached = totals.cached + 1
    return
  end
  totals.tokens = totals.tokens + (number(stats.tokens) or 0)
  totals.latency_ms = totals.latency_ms + (number(stats.latency_ms) or 0)
  local _, accepted, drafted = M.acceptance(stats)
  totals.accepted = totals.accepted + (accepted or 0)
  totals.drafted = totals.drafted + (drafted or 0)
end

--- One line of session totals.
---@param totals table
---@return string
function M.format_totals(totals)
  if totals.completions == 0 then
    return 'no completion yet'
  end
  local computed = totals.completions - totals.cached
  local line = ('%d completions'):format(totals.completions)
  if totals.cached > 0 then
    line = line .. (' (%d cached)'):format(totals.cached)
  end
  line = line .. (', %d tokens'):format(totals.tokens)
  if computed > 0 then
    line = line .. (', mean %s'):format(ms(totals.latency_ms / computed))
  end
  if totals.drafted > 0 then
    line = line .. (', %d%% of drafted tokens accepted'):format(
      math.floor(math.min(1, totals.accepted / totals.drafted) * 100 + 0.5)
    )
  end
  return line
end

return M
