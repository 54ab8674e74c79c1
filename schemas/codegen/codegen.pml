<!--
  Multi-file code generation (Prompt Cache paper, Figure 6 and Appendix A.1.1): each module holds one
  Python source file of a small turn-based strategy game and is named like the file. A prompt imports
  the files a task needs, the way code imports modules, and adds the instruction.

  The sources contain `<`, `<=`, `>` and `&`. board.py and player.py are wrapped in CDATA; unit.py,
  game.py and database.py keep raw comparisons such as `0 < distance <= self.attack_range()`, which
  the parser keeps as text with a warning, as the original Prompt Cache schemas do. utils.py is loaded
  from src/utils.py with `src`.
-->
<schema name="codegen">
  <system>
    You are a senior Python engineer who reads several source files at once and understands how they
    fit together. The files below make up a small turn-based strategy game played on a grid: units
    with abilities stored as bit flags, a board with terrain and strategic points, players, the game
    rules and a SQLite store of finished games.

    When you write code, follow the style of the existing files: type hints everywhere, small methods,
    dataclasses where they fit, and errors raised as ValueError with a message that says what went
    wrong. Return complete files or complete functions, never fragments with ellipses, and mention
    any existing function whose behaviour your change affects.
  </system>
  <user>
    Please read the given source files and understand their structure and relationships. I'll give
    you my instruction afterwards.

    <module name="utils.py" src="src/utils.py"/>
    <module name="unit.py">
      from dataclasses import dataclass

      from utils import FLAG_ARMORED, FLAG_RANGED, Position, has_flag, manhattan


      @dataclass
      class Unit:
          unit_type: str
          owner: str
          position: Position
          health_points: int = 10
          attack_power: int = 3
          movement_range: int = 2
          flags: int = 0

          @property
          def is_alive(self) -> bool:
              return self.health_points > 0

          def attack_range(self) -> int:
              return 3 if has_flag(self.flags, FLAG_RANGED) else 1

          def can_attack(self, other: "Unit") -> bool:
              distance = manhattan(self.position, other.position)
              return other.owner != self.owner and other.is_alive and 0 < distance <= self.attack_range()

          def take_damage(self, amount: int) -> int:
              """Apply damage and return how much was actually dealt."""
              if has_flag(self.flags, FLAG_ARMORED):
                  amount = max(1, amount - 1)
              dealt = min(amount, self.health_points)
              self.health_points -= dealt
              return dealt

          def attack(self, other: "Unit") -> int:
              if not self.can_attack(other):
                  raise ValueError(f"{self.unit_type} at {self.position} cannot attack {other.unit_type}")
              return other.take_damage(self.attack_power)
    </module>
    <module name="board.py">
      <![CDATA[
      from collections import deque

      from utils import FLAG_FLYING, Position, has_flag, in_bounds, neighbours

      PLAIN = "."
      FOREST = "^"
      WATER = "~"
      STRATEGIC_POINT = "*"


      class Board:
          def __init__(self, rows: list[str]):
              if not rows or any(len(row) != len(rows[0]) for row in rows):
                  raise ValueError("the board must be a non-empty rectangle")
              self.width = len(rows[0])
              self.height = len(rows)
              self.strategic_points: set[Position] = set()
              self.rows = []
              for y, row in enumerate(rows):
                  for x, cell in enumerate(row):
                      if cell == STRATEGIC_POINT:
                          self.strategic_points.add((x, y))
                  self.rows.append(row.replace(STRATEGIC_POINT, PLAIN))

          @classmethod
          def from_text(cls, text: str) -> "Board":
              return cls([line.strip() for line in text.strip().splitlines()])

          def terrain(self, position: Position) -> str:
              x, y = position
              return self.rows[y][x]

          def movement_cost(self, position: Position) -> int:
              return 2 if self.terrain(position) == FOREST else 1

          def is_passable(self, position: Position, flags: int = 0) -> bool:
              if not in_bounds(position, self.width, self.height):
                  return False
              return self.terrain(position) != WATER or has_flag(flags, FLAG_FLYING)

          def reachable(self, start: Position, budget: int, flags: int = 0) -> set[Position]:
              """Every cell a unit can reach from `start` spending at most `budget` movement points."""
              best = {start: 0}
              queue = deque([start])
              while queue:
                  current = queue.popleft()
                  for step in neighbours(current, self.width, self.height):
                      if not self.is_passable(step, flags):
                          continue
                      cost = best[current] + (1 if has_flag(flags, FLAG_FLYING) else self.movement_cost(step))
                      if cost <= budget and (step not in best or cost < best[step]):
                          best[step] = cost
                          queue.append(step)
              return set(best) - {start}

          def contested_points(self, held_by_a: set[Position], held_by_b: set[Position]) -> set[Position]:
              """Strategic points that both sides claim (for example after a simultaneous move)."""
              return self.strategic_points & held_by_a & held_by_b
      ]]>
    </module>
    <module name="player.py">
      <![CDATA[
      from unit import Unit
      from utils import Position


      class Player:
          def __init__(self, name: str):
              self.name = name
              self.units: list[Unit] = []
              self.captured_points: set[Position] = set()
              self.allies: set[str] = set()

          def add_unit(self, unit: Unit) -> None:
              if unit.owner != self.name:
                  raise ValueError(f"{unit.unit_type} belongs to {unit.owner}, not {self.name}")
              self.units.append(unit)

          def living_units(self) -> list[Unit]:
              return [unit for unit in self.units if unit.is_alive]

          def has_lost(self) -> bool:
              return len(self.living_units()) == 0

          def form_alliance(self, other: "Player") -> None:
              self.allies.add(other.name)
              other.allies.add(self.name)

          def is_allied_with(self, other: "Player") -> bool:
              return other.name in self.allies and self.name in other.allies

          def common_allies(self, other: "Player") -> set[str]:
              return (self.allies & other.allies) - {self.name, other.name}

          def score(self) -> int:
              return 10 * len(self.captured_points) + sum(unit.health_points for unit in self.living_units())
      ]]>
    </module>
    <module name="game.py">
      from board import Board
      from player import Player
      from unit import Unit
      from utils import Position


      class Game:
          def __init__(self, board: Board, players: list[Player], max_turns: int = 50):
              if len(players) < 2:
                  raise ValueError("a game needs at least two players")
              self.board = board
              self.players = players
              self.max_turns = max_turns
              self.turn = 0
              self.log: list[str] = []

          @property
          def current_player(self) -> Player:
              return self.players[self.turn % len(self.players)]

          def unit_at(self, position: Position) -> Unit | None:
              for player in self.players:
                  for unit in player.living_units():
                      if unit.position == position:
                          return unit
              return None

          def move(self, unit: Unit, target: Position) -> None:
              if unit.owner != self.current_player.name:
                  raise ValueError(f"it is {self.current_player.name}'s turn")
              reachable = self.board.reachable(unit.position, unit.movement_range, unit.flags)
              if target not in reachable or self.unit_at(target) is not None:
                  raise ValueError(f"{unit.unit_type} cannot move from {unit.position} to {target}")
              self.log.append(f"{self.turn}: {unit.owner} moves {unit.unit_type} {unit.position} -> {target}")
              unit.position = target
              if target in self.board.strategic_points:
                  for player in self.players:
                      player.captured_points.discard(target)
                  self.current_player.captured_points.add(target)

          def attack(self, attacker: Unit, defender: Unit) -> int:
              if attacker.owner != self.current_player.name:
                  raise ValueError(f"it is {self.current_player.name}'s turn")
              dealt = attacker.attack(defender)
              self.log.append(f"{self.turn}: {attacker.unit_type} hits {defender.unit_type} for {dealt}")
              return dealt

          def next_turn(self) -> None:
              self.turn += 1

          def winner(self) -> Player | None:
              alive = [player for player in self.players if not player.has_lost()]
              if len(alive) == 1:
                  return alive[0]
              total_points = len(self.board.strategic_points)
              for player in alive:
                  if total_points > 0 and len(player.captured_points) >= total_points:
                      return player
              if self.turn >= self.max_turns:
                  return max(alive, key=lambda player: player.score())
              return None
    </module>
    <module name="database.py">
      import sqlite3

      from game import Game

      SCHEMA = """
      CREATE TABLE IF NOT EXISTS games (
          id INTEGER PRIMARY KEY AUTOINCREMENT,
          winner TEXT,
          turns INTEGER NOT NULL
      );
      CREATE TABLE IF NOT EXISTS scores (
          game_id INTEGER NOT NULL REFERENCES games(id),
          player TEXT NOT NULL,
          score INTEGER NOT NULL
      );
      """


      class Database:
          def __init__(self, path: str = ":memory:"):
              self.connection = sqlite3.connect(path)
              self.connection.executescript(SCHEMA)

          def save_game(self, game: Game) -> int:
              winner = game.winner()
              with self.connection:
                  cursor = self.connection.execute(
                      "INSERT INTO games (winner, turns) VALUES (?, ?)",
                      (winner.name if winner is not None else None, game.turn),
                  )
                  game_id = cursor.lastrowid
                  self.connection.executemany(
                      "INSERT INTO scores (game_id, player, score) VALUES (?, ?, ?)",
                      [(game_id, player.name, player.score()) for player in game.players],
                  )
              return game_id

          def games_with_turns_between(self, low: int, high: int) -> list[tuple[int, str | None, int]]:
              return self.connection.execute(
                  "SELECT id, winner, turns FROM games WHERE turns >= ? AND turns <= ? ORDER BY id",
                  (low, high),
              ).fetchall()

          def leaderboard(self, limit: int = 10) -> list[tuple[str, int, int]]:
              """Players ordered by wins, then by total score."""
              return self.connection.execute(
                  """
                  SELECT s.player,
                         SUM(CASE WHEN g.winner = s.player THEN 1 ELSE 0 END) AS wins,
                         SUM(s.score) AS total
                  FROM scores s JOIN games g ON g.id = s.game_id
                  GROUP BY s.player
                  ORDER BY wins DESC, total DESC
                  LIMIT ?
                  """,
                  (limit,),
              ).fetchall()

          def close(self) -> None:
              self.connection.close()
    </module>
  </user>
  <assistant>
    I have read and understood the source files. I am ready to write code: give me the instructions.
  </assistant>
</schema>
