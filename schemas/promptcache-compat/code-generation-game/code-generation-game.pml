<schema name="code-generation-game">

    <system>
        You are a sophisticated language model assistant that can read and understand multiple source
        files at the same time. The files you will be given contain the Python classes of a small
        turn-based strategy game.

        Using what you learn from the source files, write code that follows the instructions you will
        be given, in the style of the existing files.
    </system>

    <user>
        Please read the given source files and understand their structure and relationships. I'll
        provide you with my instruction afterwards.

    <module name="unit.py">
class Unit:
    def __init__(self, unit_type, health_points, attack_power, movement_range):
        self.unit_type = unit_type
        self.health_points = health_points
        self.attack_power = attack_power
        self.movement_range = movement_range
        self.owner = None
        self.position = None

    def is_alive(self):
        return self.health_points > 0

    def distance_to(self, position):
        return abs(self.position[0] - position[0]) + abs(self.position[1] - position[1])

    def move(self, new_position, game_map):
        # A unit moves at most movement_range steps and only onto a free cell of the map
        if self.distance_to(new_position) > self.movement_range:
            return False
        if not game_map.is_move_valid(new_position):
            return False
        game_map.place(self, new_position)
        return True

    def attack(self, other_unit):
        if other_unit.owner is self.owner or self.distance_to(other_unit.position) > 1:
            return 0
        damage = min(self.attack_power, other_unit.health_points)
        other_unit.health_points -= damage
        return damage

    </module>

    <module name="map.py">
class Map:
    def __init__(self, grid_size, strategic_points):
        self.grid_size = grid_size
        self.strategic_points = list(strategic_points)
        self.unit_positions = {}

    def is_move_valid(self, position):
        # Check if the position is within the grid and not occupied
        inside = 0 <= position[0] < self.grid_size and 0 <= position[1] < self.grid_size
        return inside and position not in self.unit_positions

    def place(self, unit, position):
        if unit.position is not None:
            del self.unit_positions[unit.position]
        unit.position = position
        self.unit_positions[position] = unit

    def remove(self, unit):
        self.unit_positions.pop(unit.position, None)

    def capture_point(self, position, player):
        if position in self.strategic_points and position not in player.captured_points:
            player.captured_points.append(position)
            return True
        return False

    </module>

    <module name="player.py">
class Player:
    def __init__(self, name):
        self.name = name
        self.units = []
        self.captured_points = []
        self.allies = []

    def add_unit(self, unit):
        unit.owner = self
        self.units.append(unit)

    def living_units(self):
        return [unit for unit in self.units if unit.is_alive()]

    def form_alliance(self, other_player):
        if other_player is not self and other_player not in self.allies:
            self.allies.append(other_player)
            other_player.allies.append(self)

    </module>

    <module name="game.py">
class Game:
    def __init__(self, game_map, players, max_turns=100):
        self.map = game_map
        self.players = players
        self.current_turn = 0
        self.max_turns = max_turns

    def current_player(self):
        return self.players[self.current_turn % len(self.players)]

    def next_turn(self):
        self.current_turn += 1
        for player in self.players:
            for unit in player.units:
                if not unit.is_alive():
                    self.map.remove(unit)

    def is_game_over(self):
        # The game ends when a player holds every strategic point or is the last one standing
        for player in self.players:
            if len(player.captured_points) == len(self.map.strategic_points):
                return True, player
        standing = [player for player in self.players if len(player.living_units()) > 0]
        if len(standing) == 1:
            return True, standing[0]
        if self.current_turn >= self.max_turns:
            return True, None
        return False, None

    </module>

    <module name="database.py">
class Database:
    def __init__(self):
        self.games = []
        self.players = {}

    def save_game(self, game):
        over, winner = game.is_game_over()
        self.games.append({"turns": game.current_turn, "winner": winner.name if winner else None})
        for player in game.players:
            stats = self.players.setdefault(player.name, {"games": 0, "wins": 0})
            stats["games"] += 1
            if player is winner:
                stats["wins"] += 1
        return len(self.games) - 1

    def retrieve_all_games(self):
        return list(self.games)

    def win_rate(self, name):
        stats = self.players.get(name)
        if stats is None or stats["games"] <= 0:
            return 0.0
        return stats["wins"] / stats["games"]

    </module>

    </user>

    <assistant>
        I have read and understood the source files. I am ready to generate code.
        Give me the instructions.
    </assistant>

</schema>
